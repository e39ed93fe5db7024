"""Keys that hold their owner's token: taken, kept and deleted only by that owner.

Leases (locks.py), the adapters' key-value space (kv.py), the gateway's dedupe marks and
the scheduler's running markers rest on the same compare-and-set Lua scripts, so they are
written here once, with the two helpers every Lua user of the store shares
(:func:`shared_script`, :func:`queue_script`, :func:`execute_with`). The scheduler may not import ``bot``: it receives :class:`OwnedKeys`
through its port (``scheduler.ports.OwnedKeys``).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript

# Take the key if free; also succeeds (and refreshes the TTL) when it already holds our
# token, so a command the client retried after a lost reply still reads as taken by us.
ACQUIRE = """
local current = redis.call('GET', KEYS[1])
if not current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

EXTEND_IF_OWNER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# The hash field's version of ACQUIRE, without a TTL (the hash has its own): take field
# ARGV[1] for the token ARGV[2] unless another token holds it. 1 when taken (or already ours).
ACQUIRE_FIELD = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
if current == ARGV[2] then
  return 1
end
return 0
"""

DELETE_IF_OWNER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def ttl_ms(ttl_s: float) -> int:
    """A TTL in whole milliseconds (rounded up); non-positive TTLs are a caller bug."""
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not math.isfinite(ttl_s):
        raise ValueError(f"ttl_s must be a finite number of seconds, got {ttl_s!r}")
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be positive, got {ttl_s!r}")
    return max(1, math.ceil(ttl_s * 1000))


_SCRIPTS: weakref.WeakKeyDictionary[aioredis.Redis, dict[str, AsyncScript]] = weakref.WeakKeyDictionary()


def shared_script(client: aioredis.Redis, body: str) -> AsyncScript:
    """``client.register_script(body)``, made once per client: objects built per message
    (a session's lock) would otherwise hash their scripts' bodies every time."""
    scripts = _SCRIPTS.setdefault(client, {})
    script = scripts.get(body)
    if script is None:
        script = scripts[body] = client.register_script(body)
    return script


def queue_script(pipe: Pipeline, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> None:
    """Queue ``script`` on ``pipe`` as an EVAL of its body: queued the usual way, redis-py
    first asks the server ``SCRIPT EXISTS``, a second round trip for every such pipeline."""
    pipe.eval(str(script.script), len(keys), *keys, *args)


# Writes that travel in another step's round trip: queued last on that step's pipeline,
# then handed all of its replies.
RideAlong = Callable[[Pipeline], Callable[[list[Any]], None]]


async def execute_with(pipe: Pipeline, also: RideAlong | None) -> list[Any]:
    """Run ``pipe`` with ``also``'s writes queued last, and hand them their replies."""
    read = also(pipe) if also is not None else None
    replies: list[Any] = await pipe.execute()
    if read is not None:
        read(replies)
    return replies


class OwnedKeys:
    """The owner-checked operations on full key names (callers build them with ``Keys``),
    and on one field of a hash (a mark among a record's fields)."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._acquire = shared_script(client, ACQUIRE)
        self._acquire_field = shared_script(client, ACQUIRE_FIELD)
        self._extend = shared_script(client, EXTEND_IF_OWNER)
        self._delete = shared_script(client, DELETE_IF_OWNER)

    async def acquire(self, key: str, token: str, ttl_s: float) -> bool:
        """Set ``key`` to ``token`` for ``ttl_s`` unless another token holds it."""
        return bool(await self._acquire(keys=[key], args=[token, ttl_ms(ttl_s)]))

    def queue_acquire(self, pipe: Pipeline, key: str, token: str, ttl_s: float) -> None:
        """:meth:`acquire` queued on ``pipe`` (its reply: 1 when taken)."""
        queue_script(pipe, self._acquire, [key], [token, ttl_ms(ttl_s)])

    async def acquire_field(self, key: str, field: str, token: str) -> bool:
        """Set ``field`` of the hash ``key`` to ``token`` unless another token holds it."""
        return bool(await self._acquire_field(keys=[key], args=[field, token]))

    def queue_acquire_field(self, pipe: Pipeline, key: str, field: str, token: str) -> None:
        """:meth:`acquire_field` queued on ``pipe`` (its reply: 1 when taken)."""
        queue_script(pipe, self._acquire_field, [key], [field, token])

    async def extend_if_owner(self, key: str, token: str, ttl_s: float) -> bool:
        """Renew the TTL while ``key`` still holds ``token``; False when it is gone or taken."""
        return bool(await self._extend(keys=[key], args=[token, ttl_ms(ttl_s)]))

    async def delete_if_owner(self, key: str, token: str) -> bool:
        """Delete ``key`` if it still holds ``token``; True when it was deleted."""
        return bool(await self._delete(keys=[key], args=[token]))
