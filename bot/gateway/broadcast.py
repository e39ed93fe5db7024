"""One pub/sub connection per replica, fanning messages out to handlers by channel.

Pub/sub is best effort (a reconnect can miss messages), so every user of it also
keeps the state in a key that is polled; pub/sub only makes things immediate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
import structlog

from bot.tasks import stop_task

log = structlog.get_logger(__name__)

Handler = Callable[[dict[str, Any]], Awaitable[None]]


class Broadcast:
    def __init__(self, client: aioredis.Redis) -> None:
        self._r = client
        self._handlers: dict[str, Handler] = {}
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    def on(self, channel: str, handler: Handler) -> None:
        if self._task is not None:
            raise RuntimeError("subscribe before start()")
        self._handlers[channel] = handler

    async def publish(self, channel: str, data: dict[str, Any]) -> None:
        await self._r.publish(channel, json.dumps(data))

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="broadcast")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._subscribed.wait(), timeout=5.0)

    async def _run(self) -> None:
        while True:
            pubsub = self._r.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(*self._handlers)
                self._subscribed.set()
                while True:
                    msg = await pubsub.get_message(timeout=1.0)
                    if msg is None or msg.get("type") != "message":
                        continue
                    handler = self._handlers.get(str(msg["channel"]))
                    if handler is None:
                        continue
                    try:
                        await handler(json.loads(msg["data"]))
                    except Exception:
                        log.exception("broadcast.handler_failed", channel=str(msg["channel"]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("broadcast.reconnecting", error=str(exc))
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def close(self) -> None:
        await stop_task(self._task)
        self._task = None
