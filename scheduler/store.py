"""The scheduler's Redis: cron jobs, fire claims, the run ledger and run-now requests.

Keys (all under the configured prefix):

* ``<prefix>:cron:job:<id>`` — the job as JSON (:class:`~scheduler.jobs.CronJob`);
* ``<prefix>:cron:jobs`` — the set of job ids;
* ``<prefix>:cron:changes`` — pub/sub channel; messages are JSON
  ``{"op": "upsert" | "remove", "id": ...}`` or ``{"op": "run_now"}``. Every write
  publishes a change, so each replica's scheduler adds, reschedules or removes the job
  without a restart;
* ``<prefix>:fire:<job_id>:<fire_time>`` — the claim of one fire. Every replica
  schedules every job; when a fire comes due each replica tries to set it if absent (the
  *scheduled* time in ISO UTC, not the wall clock, so all replicas race for the same
  key) and only the winner runs it. Claims expire after ``ttl_s`` (7 days by default);
* ``<prefix>:cron:last_fire`` — hash job id -> ISO time, only moving forward: the
  latest claimed fire, which start-up uses to find fires missed while no replica ran;
* ``<prefix>:cron:running:<job_id>`` — held while a run is in progress, so a slow run
  is not overlapped by the next fire on another replica;
* ``<prefix>:cron:runs:<job_id>`` — the run ledger: the last runs of every job (and of
  the heartbeat), newest first, a list capped at 100 JSON :class:`RunRecord` entries;
* ``<prefix>:cron:run_now`` — ``botd cron run-now ID`` against a running daemon. The
  CLI appends a request and publishes ``{"op": "run_now"}``; every replica's scheduler
  drains the list with ``LPOP`` when it hears that (and at every periodic resync, in
  case the message was missed), so each request goes to exactly one replica (each pop
  is kept two minutes under ``<prefix>:cron:run_now:taken:<id>``, so that a pop sent
  again after a lost reply hands over what it took). The run
  lands in the ledger with ``trigger = "run_now"`` and the request id, which is how the
  CLI waits for the result. A request older than ``scheduler.run_now_max_age_s`` (10
  minutes) when taken is recorded as skipped instead of run, so a request made while
  no daemon was up does not fire hours later.

A job's grants (``allow``) are a permission: with a ``GrantSeal`` every write
stores a MAC over the id, grants and target, and a job read back whose MAC does
not verify (changed behind botd's back) runs with no grants and is logged.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import structlog
from pydantic import BaseModel, ValidationError
from redis.exceptions import WatchError

from scheduler.jobs import CorruptJobError, CronJob, DuplicateJobError, FireTrigger, RunRecord
from scheduler.ports import CronKeys, GrantSeal, OwnedKeys
from scheduler.schedules import iso_utc, parse_iso_utc

log = structlog.get_logger(__name__)


_ADVANCE = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if (not current) or current < ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
"""


def text(value: str | bytes) -> str:
    """Redis replies as text whether or not the client decodes responses."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


class FireClaims:
    """Claims and markers in Redis for one key prefix."""

    def __init__(self, redis: Any, keys: CronKeys, owned: OwnedKeys, *, ttl_s: int = 7 * 86400) -> None:
        self._redis = redis
        self._keys = keys
        self._owned = owned
        self._ttl_s = ttl_s
        self._advance = redis.register_script(_ADVANCE)

    def fire_key(self, job_id: str, fire_time: datetime) -> str:
        return self._keys.fire(job_id, iso_utc(fire_time))

    @property
    def last_fire_key(self) -> str:
        return self._keys.cron_last_fire()

    async def claim(self, job_id: str, fire_time: datetime, owner: str) -> bool:
        """True for exactly one caller per (job, scheduled time). Each call holds a token of
        its own: a retry of it after a lost reply is still its claim, another call is not."""
        return await self._owned.acquire(self.fire_key(job_id, fire_time), f"{owner}:{uuid.uuid4().hex}", self._ttl_s)

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
        return self._keys.cron_running(job_id)

    async def acquire_running(self, job_id: str, ttl_s: float) -> str | None:
        """A token while no other run of the job is in progress anywhere, else None."""
        token = uuid.uuid4().hex
        return token if await self._owned.acquire(self.running_key(job_id), token, max(1, int(ttl_s))) else None

    async def release_running(self, job_id: str, token: str) -> None:
        await self._owned.delete_if_owner(self.running_key(job_id), token)


LEDGER_SIZE = 100


class RunLedger:
    """Append and read run records (each job's list is capped at :data:`LEDGER_SIZE`)."""

    def __init__(self, redis: Any, keys: CronKeys) -> None:
        self._redis = redis
        self._keys = keys

    def key(self, job_id: str) -> str:
        return self._keys.cron_runs(job_id)

    async def append(self, record: RunRecord) -> None:
        key, entry = self.key(record.job_id), record.model_dump_json()
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.lrem(key, 0, entry)  # sent again after a lost reply, the record is still kept once
            pipe.lpush(key, entry)
            pipe.ltrim(key, 0, LEDGER_SIZE - 1)
            pipe.persist(key)
            await pipe.execute()

    async def recent(self, job_id: str, limit: int = LEDGER_SIZE) -> list[RunRecord]:
        """Newest first; entries that no longer parse are left out."""
        raw = await self._redis.lrange(self.key(job_id), 0, max(limit, 1) - 1)
        records = []
        for item in raw:
            try:
                records.append(RunRecord.model_validate_json(item))
            except ValidationError:
                continue
        return records

    async def expire(self, job_id: str, ttl_s: int) -> None:
        """Keep a removed job's history for a while, then let it go."""
        await self._redis.expire(self.key(job_id), ttl_s)

    @staticmethod
    def skipped(
        job_id: str,
        reason: str,
        *,
        at: datetime,
        fire_time: datetime | None,
        trigger: FireTrigger,
        request_id: str | None = None,
    ) -> RunRecord:
        """A record for a fire that was decided not to run (no LLM call was made)."""
        return RunRecord(
            job_id=job_id,
            fire_time=fire_time,
            trigger=trigger,
            request_id=request_id,
            started_at=at,
            finished_at=at,
            run_status="skipped",
            error=reason,
        )


class RunNowRequest(BaseModel):
    job_id: str
    request_id: str
    requested_at: datetime


# Push and pop as the same request sent again (its reply lost) must see them: a push
# queues an entry (unique by its request id) unless it waits already; a pop records what it
# took under its own key (KEYS[2], for ARGV[1] ms) and hands that over when sent again.
_PUSH = """
if not redis.call('LPOS', KEYS[1], ARGV[1]) then
  redis.call('RPUSH', KEYS[1], ARGV[1])
end
return 1
"""
_POP = """
local taken = redis.call('GET', KEYS[2])
if taken then
  return taken
end
taken = redis.call('LPOP', KEYS[1])
if taken then
  redis.call('SET', KEYS[2], taken, 'PX', ARGV[1])
end
return taken
"""
POPPED_KEEP_MS = 120_000


class RunNowQueue:
    """The list of pending run-now requests for one key prefix."""

    def __init__(self, redis: Any, keys: CronKeys) -> None:
        self._redis = redis
        self._keys = keys
        self.key = keys.cron_run_now()
        self._push = redis.register_script(_PUSH)
        self._pop = redis.register_script(_POP)

    async def push(self, job_id: str, now: datetime) -> RunNowRequest:
        request = RunNowRequest(job_id=job_id, request_id=uuid.uuid4().hex[:12], requested_at=now)
        await self._push(keys=[self.key], args=[request.model_dump_json()])
        return request

    async def pop(self) -> RunNowRequest | None:
        """The oldest request, skipping entries that do not parse; None when empty."""
        while True:
            raw = await self._pop(keys=[self.key, self._keys.cron_run_now_taken(uuid.uuid4().hex)], args=[POPPED_KEEP_MS])
            if raw is None:
                return None
            try:
                return RunNowRequest.model_validate_json(text(raw))
            except ValidationError:
                continue

    async def pending(self) -> int:
        return int(await self._redis.llen(self.key))


REMOVED_LEDGER_TTL_S = 7 * 86400
_MAX_WATCH_RETRIES = 50

# A new job and its index entry in one step, so a job is never stored unlisted (never
# scheduled). 0 when another job holds the id; a step sent again after its reply was lost
# finds its own job there and is still the add.
_ADD = """
local current = redis.call('GET', KEYS[1])
if current and current ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
return 1
"""


class JobStore:
    """add / get / list / remove / update cron jobs; each change is announced."""

    def __init__(self, redis: Any, keys: CronKeys, seal: GrantSeal | None = None) -> None:
        self._seal = seal  # None: grants are not verified (tests, tools that only read)
        self._redis = redis
        self._keys = keys
        self.ledger = RunLedger(redis, keys)
        self.run_now_queue = RunNowQueue(redis, keys)
        self._add = redis.register_script(_ADD)

    def job_key(self, job_id: str) -> str:
        return self._keys.cron_job(job_id)

    @property
    def index_key(self) -> str:
        return self._keys.cron_jobs()

    @property
    def changes_channel(self) -> str:
        return self._keys.cron_changes()

    async def add(self, job: CronJob) -> CronJob:
        """Store a new job; DuplicateJobError when the id is taken."""
        job = self._sealed(job)
        if not await self._add(keys=[self.job_key(job.id), self.index_key], args=[job.model_dump_json(), job.id]):
            raise DuplicateJobError(job.id)
        await self.publish("upsert", job.id)
        return job

    async def get(self, job_id: str) -> CronJob | None:
        """The job, None when absent; CorruptJobError when it is stored but does not parse."""
        raw = await self._redis.get(self.job_key(job_id))
        return None if raw is None else self._parse(job_id, text(raw))

    async def ids(self) -> list[str]:
        return sorted(text(m) for m in await self._redis.smembers(self.index_key))

    async def list(self) -> list[CronJob]:
        """All jobs that parse, oldest first (broken entries are logged and left out)."""
        ids = await self.ids()
        if not ids:
            return []
        raws = await self._redis.mget([self.job_key(i) for i in ids])
        jobs: list[CronJob] = []
        for job_id, raw in zip(ids, raws, strict=True):
            if raw is None:
                # The index outlived the job (a crash between two writes): heal it.
                await self._redis.srem(self.index_key, job_id)
                continue
            try:
                jobs.append(self._parse(job_id, text(raw)))
            except CorruptJobError as exc:
                log.error("cron.job_unreadable", job_id=job_id, error=str(exc))
        jobs.sort(key=lambda j: (j.created_at, j.id))
        return jobs

    async def remove(self, job_id: str) -> bool:
        """Delete the job; its ledger is kept for a week. False when there was no such job
        (read first: a delete sent again after a lost reply finds nothing left to delete)."""
        existed = await self._redis.exists(self.job_key(job_id))
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.job_key(job_id))
            pipe.srem(self.index_key, job_id)
            deleted, _ = await pipe.execute()
        await self.ledger.expire(job_id, REMOVED_LEDGER_TTL_S)
        if existed or deleted:
            await self.publish("remove", job_id)
        return bool(existed or deleted)

    async def update(self, job_id: str, change: Callable[[CronJob], CronJob]) -> CronJob | None:
        """Apply ``change`` atomically (optimistic WATCH, retried on conflict).

        ``change`` may run more than once and must be a pure function of the job.
        Returns the stored result, or None when the job does not exist (a job
        removed meanwhile is never brought back).
        """
        key = self.job_key(job_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            for _ in range(_MAX_WATCH_RETRIES):
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    if raw is None:
                        await pipe.unwatch()
                        return None
                    updated = self._sealed(change(self._parse(job_id, text(raw))))
                    if updated.id != job_id:
                        raise ValueError("update must not change the job id")
                    pipe.multi()
                    pipe.set(key, updated.model_dump_json())
                    await pipe.execute()
                except WatchError:
                    continue
                await self.publish("upsert", job_id)
                return updated
        raise RuntimeError(f"cron job {job_id!r} kept changing; update abandoned")

    async def request_run_now(self, job_id: str, now: datetime) -> RunNowRequest:
        """Queue a run-now for whichever replica takes it first (see :mod:`scheduler.store`)."""
        request = await self.run_now_queue.push(job_id, now)
        await self.publish("run_now")
        return request

    async def schedulers_listening(self) -> int:
        """How many schedulers (daemon replicas) are subscribed to the change channel now."""
        counts = await self._redis.pubsub_numsub(self.changes_channel)
        return int(counts[0][1]) if counts else 0

    async def publish(self, op: str, job_id: str | None = None) -> None:
        message: dict[str, str] = {"op": op}
        if job_id is not None:
            message["id"] = job_id
        await self._redis.publish(self.changes_channel, json.dumps(message))


    def _sealed(self, job: CronJob) -> CronJob:
        if self._seal is None:
            return job
        return job.model_copy(update={"grants_mac": self._seal.sign(*_grant_fields(job))})

    def _parse(self, job_id: str, raw: str) -> CronJob:
        job = _parse(job_id, raw)
        if self._seal is None or not job.allow or self._seal.verify(job.grants_mac, *_grant_fields(job)):
            return job
        log.warning("cron.grants_rejected", job_id=job_id, allow=list(job.allow),
                    reason="the stored grants were changed outside botd; the job runs with none")
        return job.model_copy(update={"allow": ()})


def _grant_fields(job: CronJob) -> tuple[str, ...]:
    return ("cron-grants", job.id, ",".join(job.allow), job.target.model_dump_json())


def _parse(job_id: str, raw: str) -> CronJob:
    try:
        return CronJob.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(job)"
        raise CorruptJobError(f"stored cron job {job_id!r} is unreadable: {where}: {first['msg']}") from None
