"""Broadcast: the process's one pub/sub listener, and its resync hook after a lost connection."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from bot.gateway.signals import Broadcast


async def _eventually(check: asyncio.Event, timeout_s: float = 10.0) -> None:
    await asyncio.wait_for(check.wait(), timeout=timeout_s)


async def test_a_handler_gets_the_messages_of_its_channel_only(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    seen: list[dict[str, object]] = []
    got = asyncio.Event()

    async def handler(data: dict[str, object]) -> None:
        seen.append(data)
        got.set()

    broadcast = Broadcast(redis_client)
    broadcast.on(f"{redis_prefix}:a", handler)
    await broadcast.start()
    try:
        await redis_client.publish(f"{redis_prefix}:b", '{"x": 0}')
        await broadcast.publish(f"{redis_prefix}:a", {"x": 1})
        await _eventually(got)
        assert seen == [{"x": 1}]
    finally:
        await broadcast.close()


async def test_a_lost_connection_is_resubscribed_and_reported(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    reconnected = asyncio.Event()
    after: list[dict[str, object]] = []
    got_after = asyncio.Event()

    async def on_reconnect() -> None:
        reconnected.set()

    async def handler(data: dict[str, object]) -> None:
        after.append(data)
        got_after.set()

    broadcast = Broadcast(redis_client)
    broadcast.on(f"{redis_prefix}:changes", handler)
    broadcast.on_reconnect(on_reconnect)
    await broadcast.start()
    try:
        assert not reconnected.is_set()  # the first subscription is not a reconnect
        await redis_client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        await _eventually(reconnected)
        await broadcast.publish(f"{redis_prefix}:changes", {"op": "upsert", "id": "j"})
        await _eventually(got_after)
        assert after == [{"op": "upsert", "id": "j"}]
    finally:
        await broadcast.close()
