"""Inbound dedupe (DESIGN.md §5): Telegram update ids and Slack event ids are handled once.

Platforms redeliver (Slack retries unanswered events, a restarted poller may see an
update twice). The mark is a unique token set only if absent, so a retry of our own
command whose reply got lost still reads as "first time" instead of dropping the message.
"""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis

from bot.store.keys import Keys
from bot.store.kv import ttl_ms

DEFAULT_TTL_S = 86400.0

# Set the token if absent; 1 also when the key already holds this very token (a retry).
MARK_ONCE = """
local current = redis.call('GET', KEYS[1])
if not current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if current == ARGV[1] then
  return 1
end
return 0
"""


class Deduper:
    """Answers "have we seen this inbound event before?" across replicas."""

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys
        self._mark = client.register_script(MARK_ONCE)

    async def first_time(self, key: str, ttl_s: float = DEFAULT_TTL_S) -> bool:
        """True exactly once per ``key`` within ``ttl_s`` (default 24 h)."""
        token = uuid.uuid4().hex
        return bool(await self._mark(keys=[self._keys.dedupe(key)], args=[token, ttl_ms(ttl_s)]))

    async def forget(self, key: str) -> None:
        """Drop the mark, e.g. when the event could not be accepted and may be redelivered."""
        await self._client.delete(self._keys.dedupe(key))
