"""Replica records in the store: written, refreshed, removed on stop, and dropped after a crash."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis

from bot.replicas import ReplicaBeacon, live_replicas
from bot.store.keys import Keys


async def test_a_beacon_lists_refreshes_and_leaves(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    keys = Keys(redis_prefix)
    beats: list[bool] = []
    runs = iter(range(100))

    async def state() -> dict[str, Any]:
        return {"active_runs": next(runs)}

    beacon = ReplicaBeacon(redis_client, keys, "r1", {"host": "h"}, state, interval_s=0.05, ttl_s=5,
                           on_beat=beats.append)
    await beacon.start()
    try:
        (record,) = await live_replicas(redis_client, keys)
        assert record["replica"] == "r1" and record["host"] == "h" and record["active_runs"] == 0
        for _ in range(100):
            if len(beats) >= 3:
                break
            await asyncio.sleep(0.05)
        (record,) = await live_replicas(redis_client, keys)
        assert record["active_runs"] >= 2 and all(beats)
    finally:
        await beacon.stop()
    assert await live_replicas(redis_client, keys) == []
    assert await redis_client.exists(keys.replica_index()) == 0


async def test_a_replica_that_died_disappears_with_its_ttl(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    keys = Keys(redis_prefix)

    async def state() -> dict[str, Any]:
        return {}

    dead = ReplicaBeacon(redis_client, keys, "dead", {}, state, ttl_s=0.2)
    alive = ReplicaBeacon(redis_client, keys, "alive", {}, state, ttl_s=30)
    await dead.beat()  # beats once, then "SIGKILL": no stop()
    await alive.beat()
    assert {r["replica"] for r in await live_replicas(redis_client, keys)} == {"dead", "alive"}
    await asyncio.sleep(0.3)
    assert [r["replica"] for r in await live_replicas(redis_client, keys)] == ["alive"]
    assert await redis_client.zrange(keys.replica_index(), 0, -1) == ["alive"]
    await redis_client.set(keys.replica("garbage"), "{not json")
    await redis_client.zadd(keys.replica_index(), {"garbage": 1})
    assert [r["replica"] for r in await live_replicas(redis_client, keys)] == ["alive"]
    await alive.stop()
