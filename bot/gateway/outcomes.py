"""Outcomes of scheduled runs, readable from any replica.

The scheduler claims a fire on one replica but the run may execute on another (the
session lock decides), so outcomes are written to Redis and broadcast; a waiter
listens and polls once a second as a fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import asdict

import redis.asyncio as aioredis

from bot.gateway.broadcast import Broadcast
from bot.gateway.runner import RunOutcome

_TTL_S = 24 * 3600


class OutcomeBoard:
    def __init__(self, client: aioredis.Redis, prefix: str, broadcast: Broadcast) -> None:
        self._r = client
        self._prefix = prefix
        self._broadcast = broadcast
        self._events: dict[str, asyncio.Event] = {}
        broadcast.on(self.channel, self._on_message)

    @property
    def channel(self) -> str:
        return f"{self._prefix}:outcomes"

    def _key(self, run_id: str) -> str:
        return f"{self._prefix}:outcome:{run_id}"

    async def publish(self, run_ids: list[str], outcome: RunOutcome) -> None:
        if not run_ids:
            return
        data = json.dumps(asdict(outcome))
        pipe = self._r.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.set(self._key(run_id), data, ex=_TTL_S)
        await pipe.execute()
        for run_id in run_ids:
            await self._broadcast.publish(self.channel, {"run_id": run_id})

    async def wait(self, run_id: str, timeout_s: float) -> RunOutcome | None:
        """The outcome of ``run_id``, or None if none arrived within ``timeout_s``."""
        event = self._events.setdefault(run_id, asyncio.Event())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while True:
                raw = await self._r.get(self._key(run_id))
                if raw:
                    return RunOutcome(**json.loads(raw))
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout=min(1.0, remaining))
                event.clear()
        finally:
            self._events.pop(run_id, None)

    async def _on_message(self, data: dict[str, str]) -> None:
        event = self._events.get(str(data.get("run_id")))
        if event is not None:
            event.set()
