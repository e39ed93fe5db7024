"""RedisKeyValue (the adapters' KeyValue), Deduper and key naming against a real Redis."""

from __future__ import annotations

import asyncio
import math

import pytest
import redis.asyncio as aioredis

from bot.gateway.inbox import Deduper
from bot.store import Keys, RedisKeyValue
from channels.base import KeyValue
from tests.fakes.store_requests import StoreRequests


@pytest.fixture
def keys(redis_prefix: str) -> Keys:
    return Keys(redis_prefix)


@pytest.fixture
def kv(redis_client: aioredis.Redis, redis_prefix: str) -> RedisKeyValue:
    return RedisKeyValue(redis_client, redis_prefix)


async def test_kv_implements_the_channel_contract(
    kv: RedisKeyValue, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    contract: KeyValue = kv
    assert await contract.set_nx("leader", "replica-a", 5)
    assert not await contract.set_nx("leader", "replica-b", 5)
    assert await contract.get("leader") == "replica-a"
    assert await redis_client.get(f"{redis_prefix}:kv:leader") == "replica-a"
    assert 0 < await redis_client.pttl(f"{redis_prefix}:kv:leader") <= 5000

    assert await contract.extend_if_owner("leader", "replica-a", 30)
    assert 5000 < await redis_client.pttl(f"{redis_prefix}:kv:leader") <= 30000
    assert not await contract.extend_if_owner("leader", "replica-b", 60)
    assert await redis_client.pttl(f"{redis_prefix}:kv:leader") <= 30000
    assert not await contract.extend_if_owner("missing", "replica-a", 60)

    await contract.set("plain", "v")
    assert await redis_client.pttl(f"{redis_prefix}:kv:plain") == -1
    await contract.set("plain", "w", ttl_s=0.5)
    assert await contract.get("plain") == "w"
    assert 0 < await redis_client.pttl(f"{redis_prefix}:kv:plain") <= 500
    await contract.delete("plain")
    assert await contract.get("plain") is None
    await contract.delete("plain")  # deleting a missing key is fine


async def test_kv_values_expire(kv: RedisKeyValue) -> None:
    assert await kv.set_nx("short", "x", 0.2)
    for _ in range(100):
        if await kv.get("short") is None:
            break
        await asyncio.sleep(0.05)
    assert await kv.get("short") is None
    assert await kv.set_nx("short", "y", 5)


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, True, "5"])
async def test_kv_rejects_bad_ttls(kv: RedisKeyValue, bad: object) -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        await kv.set_nx("k", "v", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl_s"):
        await kv.set("k", "v", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl_s"):
        await kv.extend_if_owner("k", "v", bad)  # type: ignore[arg-type]
    assert await kv.get("k") is None


async def test_a_command_mark_is_pending_then_done(redis_client: aioredis.Redis, keys: Keys) -> None:
    dedupe = Deduper(redis_client, keys)
    first = await dedupe.claim("telegram:update:1001")
    assert first.status == "first"
    assert 0 < await redis_client.pttl(keys.dedupe("telegram:update:1001")) <= 60_000
    # A redelivery while the first is being handled is not a duplicate yet: retry later.
    assert (await dedupe.claim("telegram:update:1001")).status == "in_flight"
    assert (await dedupe.claim("telegram:update:1002")).status == "first"
    await dedupe.confirm(first)
    assert (await dedupe.claim("telegram:update:1001")).status == "duplicate"
    assert 86_000_000 < await redis_client.pttl(keys.dedupe("telegram:update:1001")) <= 86_400_000


async def test_a_released_mark_lets_the_redelivery_through(redis_client: aioredis.Redis, keys: Keys) -> None:
    dedupe = Deduper(redis_client, keys)
    first = await dedupe.claim("slack:T1:C1:1.1")
    late = await dedupe.claim("slack:T1:C1:1.1")
    await dedupe.release(late)  # not the holder: changes nothing
    assert (await dedupe.claim("slack:T1:C1:1.1")).status == "in_flight"
    await dedupe.release(first)
    assert (await dedupe.claim("slack:T1:C1:1.1")).status == "first"


async def test_a_pending_mark_left_by_a_crash_expires(redis_client: aioredis.Redis, keys: Keys) -> None:
    dedupe = Deduper(redis_client, keys)
    assert (await dedupe.claim("telegram:update:7", pending_ttl_s=0.2)).status == "first"
    await asyncio.sleep(0.4)
    assert (await dedupe.claim("telegram:update:7")).status == "first"


async def test_dedupe_under_concurrency(redis_client: aioredis.Redis, keys: Keys) -> None:
    replicas = [Deduper(redis_client, keys) for _ in range(4)]
    claims = await asyncio.gather(*(replicas[i % 4].claim("slack:event:Ev1") for i in range(40)))
    assert [c.status for c in claims].count("first") == 1


async def test_dedupe_rejects_bad_input(redis_client: aioredis.Redis, keys: Keys) -> None:
    dedupe = Deduper(redis_client, keys)
    with pytest.raises(ValueError):
        await dedupe.claim("")
    with pytest.raises(ValueError, match="ttl_s"):
        await dedupe.claim("x", pending_ttl_s=0)
    assert (await dedupe.claim("x")).status == "first"


def test_key_names() -> None:
    keys = Keys("botd")
    sk = "agent:main:slack:channel:C1:thread:1700000000.1"
    assert keys.session_messages(sk) == f"botd:session:{sk}:messages"
    assert keys.session_meta(sk) == f"botd:session:{sk}:meta"
    assert keys.session_summary(sk) == f"botd:session:{sk}:summary"
    assert keys.session_ops(sk) == f"botd:session:{sk}:ops"
    assert keys.session_index() == "botd:sessions"
    assert keys.lock(sk) == f"botd:lock:{sk}"
    assert keys.compaction(sk) == f"botd:compaction:{sk}"
    assert keys.dedupe("telegram:1") == "botd:dedupe:telegram:1"
    assert keys.kv("x") == "botd:kv:x"
    assert keys.fire("heartbeat", "2025-01-01T09:00:00Z") == "botd:fire:heartbeat:2025-01-01T09:00:00Z"
    assert keys.key("inbox", sk) == keys.inbox(sk) == f"botd:inbox:{sk}"
    assert keys.cron_runs("daily") == "botd:cron:runs:daily"
    assert keys.cron_last_fire() == "botd:cron:last_fire"
    assert keys.pattern("cron") == "botd:cron:*"


@pytest.mark.parametrize("prefix", ["", "has space", "a:b", "x" * 65])
def test_bad_prefixes_are_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        Keys(prefix)


def test_empty_key_parts_are_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        Keys("botd").lock("")
    with pytest.raises(ValueError, match="non-empty"):
        Keys("botd").key("inbox", "")


async def test_set_many_writes_each_value_with_its_own_ttl_in_one_round_trip(
    kv: RedisKeyValue, redis_client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    contract: KeyValue = kv
    await contract.set("b", "old")
    requests = StoreRequests(monkeypatch)
    await contract.set_many([("a", "1", 600.0), ("b", "2", 1.5), ("c", "3", None)])
    assert requests.count == 1
    assert [await contract.get(k) for k in ("a", "b", "c")] == ["1", "2", "3"]
    assert 599_000 < await redis_client.pttl(f"{redis_prefix}:kv:a") <= 600_000
    assert 0 < await redis_client.pttl(f"{redis_prefix}:kv:b") <= 1500
    assert await redis_client.pttl(f"{redis_prefix}:kv:c") == -1

    requests.reset()
    await contract.set_many([])
    assert requests.count == 0  # nothing to write: no request at all


async def test_set_many_with_a_bad_ttl_writes_nothing(kv: RedisKeyValue) -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        await kv.set_many([("first", "1", 60.0), ("second", "2", -1.0)])
    assert await kv.get("first") is None  # checked before anything was sent
