"""Running daemons report themselves in the store, so ``botd status`` can list them.

Each replica writes one JSON record under ``<prefix>:replica:<id>`` with a short TTL and
refreshes it every few seconds; a replica that dies (even SIGKILL) disappears once the TTL
runs out, and readers drop its stale index entry. Nothing here is needed for correctness:
a failed beat is logged and retried, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from bot.store.keys import Keys

log = structlog.get_logger(__name__)

BEAT_INTERVAL_S = 5.0
BEAT_TTL_S = 20.0  # four missed beats: the replica is gone

# What a replica says about itself besides its identity (channels, active runs …).
StateFn = Callable[[], Awaitable[dict[str, Any]]]


class ReplicaBeacon:
    """Writes this replica's record until stopped, then removes it."""

    def __init__(
        self, client: aioredis.Redis, keys: Keys, replica_id: str, identity: dict[str, Any], state: StateFn,
        *, interval_s: float = BEAT_INTERVAL_S, ttl_s: float = BEAT_TTL_S,
        on_beat: Callable[[bool], None] | None = None,
    ) -> None:
        self._r = client
        self._keys = keys
        self._id = replica_id
        self._identity = {"replica": replica_id, "started_at": time.time(), **identity}
        self._state = state
        self._interval_s = interval_s
        self._ttl_ms = int(ttl_s * 1000)
        self._on_beat = on_beat or (lambda ok: None)
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        await self.beat()
        self._on_beat(True)
        self._task = asyncio.create_task(self._loop(), name="replica-beacon")

    async def stop(self) -> None:
        # An event, not task.cancel(): a cancellation landing inside a redis-py pipeline
        # can be absorbed by its retry logic, and the loop would go on beating.
        self._stopping.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=self._interval_s + 5.0)
            except TimeoutError:
                log.warning("replica.beacon_stop_timeout")
            self._task = None
        with contextlib.suppress(RedisError, OSError):
            pipe = self._r.pipeline(transaction=True)
            pipe.delete(self._keys.replica(self._id))
            pipe.zrem(self._keys.replica_index(), self._id)
            await pipe.execute()

    async def beat(self) -> None:
        now = time.time()
        record = {**self._identity, **(await self._state()), "seen_at": now}
        pipe = self._r.pipeline(transaction=True)
        pipe.set(self._keys.replica(self._id), json.dumps(record), px=self._ttl_ms)
        pipe.zadd(self._keys.replica_index(), {self._id: now})
        await pipe.execute()

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval_s)
            if self._stopping.is_set():
                return
            try:
                await self.beat()
            except (RedisError, OSError) as exc:
                self._on_beat(False)
                log.warning("replica.beat_failed", error=str(exc)[:200])
            else:
                self._on_beat(True)


async def live_replicas(client: aioredis.Redis, keys: Keys, *, limit: int = 100) -> list[dict[str, Any]]:
    """The records of replicas that beat within their TTL, most recent first.

    Index entries whose record expired are removed here (their replica died without
    saying goodbye), so the index never grows without bound.
    """
    ids = [str(i) for i in await client.zrevrange(keys.replica_index(), 0, limit - 1)]
    if not ids:
        return []
    raw = await client.mget([keys.replica(i) for i in ids])
    alive: list[dict[str, Any]] = []
    gone: list[str] = []
    for replica_id, item in zip(ids, raw, strict=True):
        record = _parse(item)
        if record is None:
            gone.append(replica_id)
        else:
            alive.append(record)
    if gone:
        await client.zrem(keys.replica_index(), *gone)
    return alive


def _parse(item: Any) -> dict[str, Any] | None:
    if not item:
        return None
    try:
        record = json.loads(item)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
