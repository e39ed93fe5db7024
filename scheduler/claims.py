"""Cluster-wide coordination of fires: claims, the last fire time, and "still running".

Every replica schedules every job; when a fire comes due each replica tries
``SET NX`` on ``<prefix>:fire:<job_id>:<fire_time>`` (the *scheduled* time in ISO
UTC, not the wall clock, so all replicas race for the same key) and only the
winner runs it. Keys expire after ``ttl_s`` (7 days by default).

``<prefix>:cron:last_fire`` (hash job id -> ISO time, only moving forward) records
the latest claimed fire, which start-up uses to find fires missed while no
replica was running. ``<prefix>:cron:running:<job_id>`` is held while a run is in
progress so a slow run is not overlapped by the next fire on another replica.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from scheduler.clock import iso_utc, parse_iso_utc

_ADVANCE = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if (not current) or current < ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def text(value: str | bytes) -> str:
    """Redis replies as text whether or not the client decodes responses."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


class FireClaims:
    """Claims and markers in Redis for one key prefix."""

    def __init__(self, redis: Any, prefix: str, *, ttl_s: int = 7 * 86400) -> None:
        self._redis = redis
        self._prefix = prefix
        self._ttl_s = ttl_s
        self._advance = redis.register_script(_ADVANCE)
        self._release = redis.register_script(_RELEASE)

    def fire_key(self, job_id: str, fire_time: datetime) -> str:
        return f"{self._prefix}:fire:{job_id}:{iso_utc(fire_time)}"

    @property
    def last_fire_key(self) -> str:
        return f"{self._prefix}:cron:last_fire"

    async def claim(self, job_id: str, fire_time: datetime, owner: str) -> bool:
        """True for exactly one caller per (job, scheduled time)."""
        return bool(await self._redis.set(self.fire_key(job_id, fire_time), owner, nx=True, ex=self._ttl_s))

    async def note_fire(self, job_id: str, fire_time: datetime) -> None:
        """Record ``fire_time`` as the job's last fire unless a later one is recorded."""
        await self._advance(keys=[self.last_fire_key], args=[job_id, iso_utc(fire_time)])

    async def note_baseline(self, job_id: str, moment: datetime) -> None:
        """Start counting missed fires from ``moment`` if nothing is recorded yet."""
        await self._redis.hsetnx(self.last_fire_key, job_id, iso_utc(moment))

    async def last_fire(self, job_id: str) -> datetime | None:
        raw = await self._redis.hget(self.last_fire_key, job_id)
        if raw is None:
            return None
        try:
            return parse_iso_utc(text(raw))
        except ValueError:
            return None

    async def forget(self, job_id: str) -> None:
        await self._redis.hdel(self.last_fire_key, job_id)

    def running_key(self, job_id: str) -> str:
        return f"{self._prefix}:cron:running:{job_id}"

    async def acquire_running(self, job_id: str, ttl_s: float) -> str | None:
        """A token while no other run of the job is in progress anywhere, else None."""
        token = uuid.uuid4().hex
        ok = await self._redis.set(self.running_key(job_id), token, nx=True, ex=max(1, int(ttl_s)))
        return token if ok else None

    async def release_running(self, job_id: str, token: str) -> None:
        await self._release(keys=[self.running_key(job_id)], args=[token])
