"""Follow the cron change channel: every message is applied, and a reconnect resyncs.

Pub/sub delivers only while connected, so after a connection error the feed
resubscribes and asks for a full resync (messages sent meanwhile are lost).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from scheduler.claims import text

log = structlog.get_logger(__name__)

OnMessage = Callable[[dict[str, Any]], Awaitable[None]]
OnReconnect = Callable[[], Awaitable[None]]


class ChangeFeed:
    """Subscribes to ``channel`` on ``redis`` and hands each JSON object message to ``on_message``."""

    def __init__(self, redis: Any, channel: str, on_message: OnMessage, on_reconnect: OnReconnect) -> None:
        self._redis = redis
        self._channel = channel
        self._on_message = on_message
        self._on_reconnect = on_reconnect
        self._pubsub: Any = None
        self._stopping = False

    async def subscribe(self) -> None:
        """Subscribe now (call before the initial load, so no change slips in between)."""
        self._stopping = False
        self._pubsub = self._redis.pubsub()
        await self._pubsub.subscribe(self._channel)

    async def run(self) -> None:
        """Read messages until :meth:`close`; survives connection errors."""
        while not self._stopping:
            try:
                if self._pubsub is None:
                    await self.subscribe()
                    await self._on_reconnect()
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is not None:
                    await self._dispatch(message.get("data"))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("scheduler.changes_listener_failed")
                await self._drop()
                await asyncio.sleep(1.0)

    def stop_soon(self) -> None:
        """Make :meth:`run` end at its next turn (also when a cancellation was lost)."""
        self._stopping = True

    async def close(self) -> None:
        self._stopping = True
        await self._drop()

    async def _dispatch(self, data: Any) -> None:
        try:
            message = json.loads(text(data)) if isinstance(data, str | bytes) else None
        except ValueError:
            message = None
        if not isinstance(message, dict):
            log.warning("scheduler.bad_change_message")
            return
        await self._on_message(message)

    async def _drop(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is None:
            return
        try:
            await pubsub.aclose()
        except Exception:
            log.debug("scheduler.pubsub_close_failed", exc_info=True)
