"""One fire of a cron job, from the claim to the ledger entry and the job's new state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta

import structlog

from scheduler.backoff import Transition, apply_run, disabled_notice
from scheduler.claims import FireClaims
from scheduler.clock import Clock, iso_utc
from scheduler.errors import CorruptJobError, JobNotFoundError
from scheduler.execution import RUNNER_GRACE_S, run_and_record
from scheduler.jobs import CronJob
from scheduler.ledger import FireTrigger, RunLedger, RunRecord
from scheduler.ports import ScheduledRunner
from scheduler.run_requests import cron_run_request
from scheduler.store import JobStore

log = structlog.get_logger(__name__)

_FLOOR_TOLERANCE = timedelta(seconds=1)


class CronFires:
    """Runs cron jobs for one replica; every decision that must be unique is made in Redis."""

    def __init__(
        self,
        store: JobStore,
        claims: FireClaims,
        runner: ScheduledRunner,
        *,
        agent_id: str,
        session_key_for_job: Callable[[str], str],
        run_timeout_s: float,
        clock: Clock,
        owner: str,
        redis_concurrency: int = 16,
    ) -> None:
        self._store = store
        self._ledger: RunLedger = store.ledger
        self._claims = claims
        self._runner = runner
        self._agent_id = agent_id
        self._session_key_for_job = session_key_for_job
        self._timeout_s = run_timeout_s
        self._clock = clock
        self._owner = owner
        self._running_ttl_s = run_timeout_s + RUNNER_GRACE_S + 60
        # Many jobs can come due in the same second; bounding the Redis bookkeeping in flight
        # keeps a replica from exhausting a bounded connection pool (and a run from being lost
        # after its fire was claimed).
        self._gate = asyncio.Semaphore(redis_concurrency)

    async def fire(
        self, job_id: str, fire_time: datetime, *, trigger: FireTrigger = "schedule"
    ) -> RunRecord | None:
        """A scheduled (or caught-up) fire; None when another replica has it or it does not apply."""
        async with self._gate:
            if not await self._claims.claim(job_id, fire_time, self._owner):
                return None
            await self._claims.note_fire(job_id, fire_time)
            job = await self._load(job_id)
            if job is None or not job.enabled:
                return None
            if job.not_before is not None and fire_time < job.not_before - _FLOOR_TOLERANCE:
                log.info(
                    "cron.backing_off",
                    job_id=job_id,
                    fire_time=iso_utc(fire_time),
                    until=iso_utc(job.not_before),
                )
                return None
            token = await self._claims.acquire_running(job.id, self._running_ttl_s)
            if token is None:
                return await self._skip_overlap(job, fire_time, trigger, None)
        return await self._run(job, token, fire_time, trigger, None)

    async def skip_missed(self, job_id: str, fire_time: datetime, reason: str) -> RunRecord | None:
        """Record a missed fire as skipped (catch_up: skip), once across replicas."""
        async with self._gate:
            if not await self._claims.claim(job_id, fire_time, self._owner):
                return None
            await self._claims.note_fire(job_id, fire_time)
            job = await self._load(job_id)
            if job is None or not job.enabled:
                return None
            record = RunLedger.skipped(
                job_id, reason, at=self._clock(), fire_time=fire_time, trigger="catch_up"
            )
            await self._finish(job, record)
            return record

    async def run_now(self, job_id: str, *, request_id: str | None = None) -> RunRecord:
        """Run the job immediately, enabled or not; JobNotFoundError when it does not exist."""
        now = self._clock()
        async with self._gate:
            job = await self._load(job_id)
            if job is None:
                raise JobNotFoundError(job_id)
            token = await self._claims.acquire_running(job.id, self._running_ttl_s)
            if token is None:
                return await self._skip_overlap(job, now, "run_now", request_id)
        return await self._run(job, token, now, "run_now", request_id)

    async def _load(self, job_id: str) -> CronJob | None:
        try:
            return await self._store.get(job_id)
        except CorruptJobError as exc:
            log.error("cron.job_unreadable", job_id=job_id, error=str(exc))
            return None

    async def _skip_overlap(
        self, job: CronJob, fire_time: datetime, trigger: FireTrigger, request_id: str | None
    ) -> RunRecord:
        record = RunLedger.skipped(
            job.id,
            "the previous run of this job is still in progress",
            at=self._clock(),
            fire_time=fire_time,
            trigger=trigger,
            request_id=request_id,
        )
        await self._finish(job, record)
        return record

    async def _run(
        self, job: CronJob, token: str, fire_time: datetime, trigger: FireTrigger, request_id: str | None
    ) -> RunRecord:
        # The run itself is outside the gate: runs may take minutes and must not queue each other.
        try:
            request = cron_run_request(
                job,
                agent_id=self._agent_id,
                session_key=self._session_key_for_job(job.id),
                fire_time=fire_time,
                trigger=trigger,
                request_id=request_id,
                now=self._clock(),
            )
            record = await run_and_record(
                self._runner,
                request,
                job_id=job.id,
                fire_time=fire_time,
                trigger=trigger,
                request_id=request_id,
                timeout_s=self._timeout_s,
                clock=self._clock,
            )
        finally:
            await self._claims.release_running(job.id, token)
        async with self._gate:
            await self._finish(job, record)
        return record

    async def _finish(self, job: CronJob, record: RunRecord) -> None:
        await self._ledger.append(record)
        seen: list[Transition] = []

        def change(current: CronJob) -> CronJob:
            seen.append(apply_run(current, record))
            return seen[-1].job

        updated = await self._store.update(job.id, change)
        if updated is None or not seen:
            return  # removed while it ran
        transition = seen[-1]
        if transition.remove:
            await self._store.remove(job.id)
            await self._claims.forget(job.id)
            log.info("cron.one_shot_done", job_id=job.id)
        if transition.disabled_now:
            log.warning("cron.job_disabled", job_id=job.id, failures=updated.failure_streak)
            try:
                await self._runner.notify(updated.target, disabled_notice(updated, record))
            except Exception:
                log.exception("cron.notify_failed", job_id=job.id)
