"""``/stop`` across replicas: a cancel key with a TTL plus a broadcast.

The key holds the Redis server time of the stop; a run that started at or before it
is cancelled. The broadcast makes that immediate; the key makes a missed message
harmless, because every run also checks it before each LLM call and on its watchdog.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from bot.gateway.broadcast import Broadcast

CANCEL_TTL_S = 600


async def server_time(client: aioredis.Redis) -> float:
    """Redis' clock, so replicas with skewed clocks agree on before/after."""
    sec, usec = await client.time()
    return float(sec) + float(usec) / 1_000_000


class CancelSignals:
    def __init__(self, client: aioredis.Redis, prefix: str, broadcast: Broadcast) -> None:
        self._r = client
        self._prefix = prefix
        self._broadcast = broadcast

    @property
    def channel(self) -> str:
        return f"{self._prefix}:cancel"

    def _key(self, session_key: str) -> str:
        return f"{self._prefix}:cancel:{session_key}"

    async def request(self, session_key: str) -> float:
        """Record and broadcast a stop for ``session_key``; returns its timestamp."""
        at = await server_time(self._r)
        await self._r.set(self._key(session_key), repr(at), ex=CANCEL_TTL_S)
        await self._broadcast.publish(self.channel, {"session": session_key, "at": at})
        return at

    async def stopped_since(self, session_key: str, started_at: float) -> bool:
        """True when a stop was requested at or after ``started_at``."""
        raw = await self._r.get(self._key(session_key))
        return raw is not None and float(raw) >= started_at
