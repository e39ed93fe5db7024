"""Cron jobs in Redis, and the change notifications every replica listens to.

Keys (all under the configured prefix):

* ``<prefix>:cron:job:<id>`` — the job as JSON (:class:`~scheduler.jobs.CronJob`);
* ``<prefix>:cron:jobs`` — the set of job ids;
* ``<prefix>:cron:changes`` — pub/sub channel; messages are JSON
  ``{"op": "upsert" | "remove", "id": ...}`` or ``{"op": "run_now"}``;
* the run ledger and the run-now list (:mod:`scheduler.ledger`, :mod:`scheduler.run_now`).

Every write publishes a change, so each replica's scheduler adds, reschedules
or removes the job without a restart.

A job's grants (``allow``) are a permission: with a ``GrantSeal`` every write
stores a MAC over the id, grants and target, and a job read back whose MAC does
not verify (changed behind botd's back) runs with no grants and is logged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import structlog
from pydantic import ValidationError
from redis.exceptions import WatchError

from scheduler.claims import text
from scheduler.errors import CorruptJobError, DuplicateJobError
from scheduler.jobs import CronJob
from scheduler.ledger import RunLedger
from scheduler.ports import GrantSeal
from scheduler.run_now import RunNowQueue, RunNowRequest

log = structlog.get_logger(__name__)

REMOVED_LEDGER_TTL_S = 7 * 86400
_MAX_WATCH_RETRIES = 50


class JobStore:
    """add / get / list / remove / update cron jobs; each change is announced."""

    def __init__(self, redis: Any, prefix: str, seal: GrantSeal | None = None) -> None:
        self._seal = seal  # None: grants are not verified (tests, tools that only read)
        self._redis = redis
        self.prefix = prefix
        self.ledger = RunLedger(redis, prefix)
        self.run_now_queue = RunNowQueue(redis, prefix)

    def job_key(self, job_id: str) -> str:
        return f"{self.prefix}:cron:job:{job_id}"

    @property
    def index_key(self) -> str:
        return f"{self.prefix}:cron:jobs"

    @property
    def changes_channel(self) -> str:
        return f"{self.prefix}:cron:changes"

    async def add(self, job: CronJob) -> CronJob:
        """Store a new job; DuplicateJobError when the id is taken."""
        job = self._sealed(job)
        created = await self._redis.set(self.job_key(job.id), job.model_dump_json(), nx=True)
        if not created:
            raise DuplicateJobError(job.id)
        await self._redis.sadd(self.index_key, job.id)
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
        """Delete the job; its ledger is kept for a week. False when there was no such job."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.job_key(job_id))
            pipe.srem(self.index_key, job_id)
            deleted, _ = await pipe.execute()
        await self.ledger.expire(job_id, REMOVED_LEDGER_TTL_S)
        if deleted:
            await self.publish("remove", job_id)
        return bool(deleted)

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
        """Queue a run-now for whichever replica takes it first (see :mod:`scheduler.run_now`)."""
        request = await self.run_now_queue.push(job_id, now)
        await self.publish("run_now")
        return request

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
