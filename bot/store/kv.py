"""The adapters' key-value space (``channels.base.KeyValue``), namespaced under ``<prefix>:kv:``.

Channel adapters may not import ``bot``, so they get this object through their
``ChannelContext``; it is what their leader election and small caches are built on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript

from bot.store.keys import Keys

# Compare-and-expire: extend the TTL only while the key still holds the caller's value.
EXTEND_IF_OWNER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


def queue_script(pipe: Pipeline, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> None:
    """Queue ``script`` on ``pipe`` as an EVAL of its body: queued the usual way, redis-py
    first asks the server ``SCRIPT EXISTS``, a second round trip for every such pipeline."""
    pipe.eval(str(script.script), len(keys), *keys, *args)


def ttl_ms(ttl_s: float) -> int:
    """A TTL in whole milliseconds (rounded up); non-positive TTLs are a caller bug."""
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not math.isfinite(ttl_s):
        raise ValueError(f"ttl_s must be a finite number of seconds, got {ttl_s!r}")
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be positive, got {ttl_s!r}")
    return max(1, math.ceil(ttl_s * 1000))


class RedisKeyValue:
    """Implements ``channels.base.KeyValue`` on Redis."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._client = client
        self._keys = Keys(prefix)
        self._extend = client.register_script(EXTEND_IF_OWNER)

    async def set_nx(self, key: str, value: str, ttl_s: float) -> bool:
        return bool(await self._client.set(self._keys.kv(key), value, nx=True, px=ttl_ms(ttl_s)))

    async def get(self, key: str) -> str | None:
        value = await self._client.get(self._keys.kv(key))
        return None if value is None else str(value)

    async def set(self, key: str, value: str, ttl_s: float | None = None) -> None:
        px = None if ttl_s is None else ttl_ms(ttl_s)
        await self._client.set(self._keys.kv(key), value, px=px)

    async def delete(self, key: str) -> None:
        await self._client.delete(self._keys.kv(key))

    async def extend_if_owner(self, key: str, value: str, ttl_s: float) -> bool:
        return bool(await self._extend(keys=[self._keys.kv(key)], args=[value, ttl_ms(ttl_s)]))
