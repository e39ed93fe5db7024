"""JobStore, run ledger, run-now queue and fire claims on real Redis."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from bot.store.keys import Keys
from bot.store.owned import OwnedKeys
from scheduler.jobs import CorruptJobError, CronJob, DuplicateJobError, RunRecord
from scheduler.ports import JobTarget
from scheduler.schedules import parse_every
from scheduler.store import LEDGER_SIZE, FireClaims, JobStore, RunLedger
from tests.fakes.lost_replies import LostReplies

NOW = datetime(2027, 5, 3, 8, 0, tzinfo=UTC)


def job(job_id: str = "daily", **fields: Any) -> CronJob:
    values: dict[str, Any] = {
        "id": job_id,
        "schedule": parse_every("1h", now=NOW),
        "prompt": "summarize the day",
        "target": JobTarget(channel="telegram", chat_id="99"),
        "created_at": NOW,
    }
    values.update(fields)
    return CronJob.model_validate(values)


async def collect(pubsub: Any, count: int) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while len(out) < count and loop.time() < deadline:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
        if message is not None:
            out.append(json.loads(message["data"]))
    return out


async def test_crud_and_change_notifications(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))
    pubsub = redis_client.pubsub()
    await pubsub.subscribe(store.changes_channel)
    try:
        await store.add(job("b", created_at=NOW + timedelta(seconds=1)))
        await store.add(job("a"))
        assert [j.id for j in await store.list()] == ["a", "b"]  # oldest first
        assert await redis_client.smembers(f"{redis_prefix}:cron:jobs") == {"a", "b"}
        assert (
            json.loads(await redis_client.get(f"{redis_prefix}:cron:job:a"))["prompt"] == "summarize the day"
        )
        updated = await store.update("a", lambda j: j.model_copy(update={"enabled": False}))
        assert updated is not None and not updated.enabled
        stored = await store.get("a")
        assert stored is not None and not stored.enabled
        assert await store.remove("a")
        assert not await store.remove("a")
        assert await store.get("a") is None
        assert await store.update("a", lambda j: j) is None  # a removed job is not brought back
        assert await redis_client.exists(f"{redis_prefix}:cron:job:a") == 0
        messages = await collect(pubsub, 4)
    finally:
        await pubsub.aclose()
    assert messages == [
        {"op": "upsert", "id": "b"},
        {"op": "upsert", "id": "a"},
        {"op": "upsert", "id": "a"},
        {"op": "remove", "id": "a"},
    ]


async def test_duplicate_id_is_rejected_and_nothing_is_lost(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))
    await store.add(job("daily"))
    with pytest.raises(DuplicateJobError, match="'daily' already exists"):
        await store.add(job("daily", prompt="something else"))
    stored = await store.get("daily")
    assert stored is not None and stored.prompt == "summarize the day"


async def test_concurrent_updates_are_not_lost(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))
    await store.add(job())
    second = aioredis.Redis(connection_pool=redis_client.connection_pool)

    async def bump(target: JobStore) -> None:
        for _ in range(15):
            await target.update(
                "daily", lambda j: j.model_copy(update={"failure_streak": j.failure_streak + 1})
            )

    await asyncio.gather(bump(store), bump(JobStore(second, Keys(redis_prefix))))
    stored = await store.get("daily")
    assert stored is not None and stored.failure_streak == 30


async def test_corrupt_entries_are_reported_and_skipped(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))
    await store.add(job("good"))
    await redis_client.set(store.job_key("bad"), '{"id": "bad", "prompt": 3}')
    await redis_client.sadd(store.index_key, "bad", "ghost")
    with pytest.raises(CorruptJobError, match="stored cron job 'bad' is unreadable"):
        await store.get("bad")
    assert [j.id for j in await store.list()] == ["good"]
    # The dangling id is healed, the unreadable job is kept for an operator to inspect.
    assert await redis_client.smembers(store.index_key) == {"good", "bad"}


async def test_ledger_is_capped_and_newest_first(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    ledger = RunLedger(redis_client, Keys(redis_prefix))
    for n in range(LEDGER_SIZE + 5):
        at = NOW + timedelta(minutes=n)
        await ledger.append(
            RunRecord(
                job_id="daily",
                run_id=f"r{n}",
                started_at=at,
                finished_at=at,
                run_status="ok",
                delivery_status="delivered",
            )
        )
    records = await ledger.recent("daily")
    assert len(records) == LEDGER_SIZE
    assert records[0].run_id == f"r{LEDGER_SIZE + 4}" and records[-1].run_id == "r5"
    assert await redis_client.llen(f"{redis_prefix}:cron:runs:daily") == LEDGER_SIZE
    await redis_client.lpush(ledger.key("daily"), "not json")
    assert len(await ledger.recent("daily", limit=3)) == 2


async def test_removed_job_keeps_its_ledger_for_a_while(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))
    await store.add(job())
    await store.ledger.append(RunLedger.skipped("daily", "x", at=NOW, fire_time=NOW, trigger="schedule"))
    await store.remove("daily")
    ttl = await redis_client.ttl(store.ledger.key("daily"))
    assert 0 < ttl <= 7 * 86400


async def test_run_now_queue(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))
    first = await store.request_run_now("daily", NOW)
    await redis_client.rpush(store.run_now_queue.key, "garbage")
    second = await store.request_run_now("heartbeat", NOW)
    assert await store.run_now_queue.pending() == 3
    got = [await store.run_now_queue.pop(), await store.run_now_queue.pop(), await store.run_now_queue.pop()]
    assert [r.request_id if r else None for r in got] == [first.request_id, second.request_id, None]


async def test_claims_and_last_fire(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    claims = FireClaims(redis_client, Keys(redis_prefix), OwnedKeys(redis_client), ttl_s=3600)
    fire = datetime(2027, 5, 3, 10, 0, 0, 123_000, tzinfo=UTC)
    assert claims.fire_key("daily", fire) == f"{redis_prefix}:fire:daily:2027-05-03T10:00:00Z"
    assert await claims.claim("daily", fire, "a")
    assert not await claims.claim("daily", fire, "b")
    assert await claims.claim("daily", fire + timedelta(hours=1), "b")
    assert await claims.last_fire("daily") is None
    await claims.note_fire("daily", fire + timedelta(hours=1))
    await claims.note_fire("daily", fire)  # never moves backwards
    assert await claims.last_fire("daily") == (fire + timedelta(hours=1)).replace(microsecond=0)
    await claims.note_baseline("daily", NOW)
    assert await claims.last_fire("daily") == (fire + timedelta(hours=1)).replace(microsecond=0)
    await claims.note_baseline("other", NOW)
    assert await claims.last_fire("other") == NOW
    await claims.forget("daily")
    assert await claims.last_fire("daily") is None


async def held_until_released(claims: FireClaims, token: str) -> None:
    """The running marker ``token`` holds: no other is taken until it is released."""
    assert await claims.acquire_running("daily", 30) is None
    await claims.release_running("daily", token)
    assert await claims.acquire_running("daily", 30) is not None


async def test_running_marker_belongs_to_its_holder(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    claims = FireClaims(redis_client, Keys(redis_prefix), OwnedKeys(redis_client))
    token = await claims.acquire_running("daily", 30)
    assert token is not None
    assert await claims.acquire_running("daily", 30) is None
    await claims.release_running("daily", "someone-else")
    await held_until_released(claims, token)


async def test_claims_retried_after_a_lost_reply_are_still_ours(
    store_client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store applies the claim and its reply is lost: redis-py sends it again. The fire
    # (or the running marker) is then held by this very call, which must still run it.
    claims = FireClaims(store_client, Keys(redis_prefix), OwnedKeys(store_client))
    LostReplies(monkeypatch, ":fire:", 1)
    assert await claims.claim("daily", NOW, "a"), "the fire would run nowhere"
    assert not await claims.claim("daily", NOW, "a"), "a second claim, even by the same owner, loses"
    LostReplies(monkeypatch, ":cron:running:", 1)
    token = await claims.acquire_running("daily", 30)
    assert token is not None, "the run would be skipped as overlapping itself"
    await held_until_released(claims, token)


async def test_a_job_added_again_after_a_lost_reply_is_added_and_listed(
    store_client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Read as a duplicate, the add would fail with the job stored but never listed (so
    # never scheduled), and the chat told its reminder was not set.
    store = JobStore(store_client, Keys(redis_prefix))
    lost = LostReplies(monkeypatch, ":cron:job:daily", 1)
    await store.add(job("daily"))
    assert lost.lost == 1
    assert await store.ids() == ["daily"]
    with pytest.raises(DuplicateJobError):  # another job under the id is still refused
        await store.add(job("daily", prompt="something else"))
    lost = LostReplies(monkeypatch, ":cron:job:daily", 1, commands=("DEL", "MULTI", "EXEC"))
    assert await store.remove("daily"), "a removed job would read as never there"
    assert lost.lost == 1
    assert await store.ids() == [] and await store.get("daily") is None
    assert not await store.remove("daily")


async def test_run_now_requests_sent_again_after_a_lost_reply_run_once(
    store_client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = JobStore(store_client, Keys(redis_prefix)).run_now_queue
    LostReplies(monkeypatch, ":cron:run_now", 1)
    first = await queue.push("daily", NOW)
    assert await queue.pending() == 1, "a push sent again must not queue the run twice"
    second = await queue.push("daily", NOW)
    LostReplies(monkeypatch, ":cron:run_now", 1)
    popped = await queue.pop()
    assert popped is not None and popped.request_id == first.request_id, "the first request was lost"
    assert await queue.pending() == 1
    again = await queue.pop()
    assert again is not None and again.request_id == second.request_id
    assert await queue.pop() is None


async def test_a_run_record_sent_again_after_a_lost_reply_is_kept_once(
    store_client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = RunLedger(store_client, Keys(redis_prefix))
    LostReplies(monkeypatch, ":cron:runs:", 1)
    await ledger.append(RunLedger.skipped("daily", "x", at=NOW, fire_time=NOW, trigger="schedule"))
    assert len(await ledger.recent("daily")) == 1


async def test_works_with_a_client_that_does_not_decode(redis_url: str, redis_prefix: str) -> None:
    raw = aioredis.Redis.from_url(redis_url)
    try:
        store = JobStore(raw, Keys(redis_prefix))
        await store.add(job())
        assert [j.id for j in await store.list()] == ["daily"]
        fetched = await store.get("daily")
        assert fetched is not None and fetched.id == "daily"
        claims = FireClaims(raw, Keys(redis_prefix), OwnedKeys(raw))
        await claims.note_fire("daily", NOW)
        assert await claims.last_fire("daily") == NOW
        await store.request_run_now("daily", NOW)
        request = await store.run_now_queue.pop()
        assert request is not None and request.job_id == "daily"
    finally:
        await raw.aclose()
