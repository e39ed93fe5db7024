"""The adapters' key-value space (``channels.base.KeyValue``), namespaced under ``<prefix>:kv:``.

Channel adapters may not import ``bot``, so they get this object through their
``ChannelContext``; it is what their leader election and small caches are built on.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from bot.store.keys import Keys
from bot.store.owned import OwnedKeys, ttl_ms
from channels.base import KeyWrite


class RedisKeyValue:
    """Implements ``channels.base.KeyValue`` on Redis."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._client = client
        self._keys = Keys(prefix)
        self._owned = OwnedKeys(client)

    async def set_nx(self, key: str, value: str, ttl_s: float) -> bool:
        return bool(await self._client.set(self._keys.kv(key), value, nx=True, px=ttl_ms(ttl_s)))

    async def get(self, key: str) -> str | None:
        value = await self._client.get(self._keys.kv(key))
        return None if value is None else str(value)

    async def set(self, key: str, value: str, ttl_s: float | None = None) -> None:
        px = None if ttl_s is None else ttl_ms(ttl_s)
        await self._client.set(self._keys.kv(key), value, px=px)

    async def set_many(self, writes: Sequence[KeyWrite]) -> None:
        """Several ``set`` in one pipeline: one round trip, no transaction (none is needed:
        each write stands alone, as separate calls would)."""
        if not writes:
            return
        pipe = self._client.pipeline(transaction=False)
        for key, value, ttl_s in writes:
            pipe.set(self._keys.kv(key), value, px=None if ttl_s is None else ttl_ms(ttl_s))
        await pipe.execute()

    async def delete(self, key: str) -> None:
        await self._client.delete(self._keys.kv(key))

    async def extend_if_owner(self, key: str, value: str, ttl_s: float) -> bool:
        return await self._owned.extend_if_owner(self._keys.kv(key), value, ttl_s)
