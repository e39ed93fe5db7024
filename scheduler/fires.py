"""One fire, from the claim to the ledger entry: the request it produces, handing it to
the daemon's runner, and what the run does to its cron job.

The RunRequests a fire produces: scheduled runs use the minimal prompt. The request's
``channel``/``chat_id``/``thread_id`` are the *delivery target* (not "cron"/"heartbeat"),
so the gateway delivers there; ``kind`` tells it which silent-reply rule applies
(NO_REPLY for cron, HEARTBEAT_OK for heartbeats). ``meta`` carries ``job_id``,
``fire_time`` (ISO UTC), ``trigger`` and, for cron, ``fresh_session="1"`` (every cron
run starts with an empty ``agent:<id>:cron:<job_id>`` session), ``created_by`` and, for
a run-now, ``request_id``. No person is behind a scheduled run, so ``user_id`` is empty.

``run_and_record`` hands one request to the runner and turns whatever happens into a
RunRecord; ``CronFires`` runs cron jobs for one replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import structlog

from agent.types import RunRequest, ToolPolicy
from scheduler.jobs import (
    HEARTBEAT_JOB_ID,
    CorruptJobError,
    CronJob,
    FireTrigger,
    JobNotFoundError,
    RunRecord,
    Transition,
    apply_run,
    clip_error,
    disabled_notice,
)
from scheduler.ports import DELIVERY_STATUSES, RUN_STATUSES, JobTarget, ScheduledOutcome, ScheduledRunner
from scheduler.schedules import Clock, iso_utc
from scheduler.store import FireClaims, JobStore, RunLedger

log = structlog.get_logger(__name__)


# The runner enforces timeout_s itself; this extra margin only guards against a runner
# that never returns, so a stuck run cannot hold its job forever.
RUNNER_GRACE_S = 30.0


async def run_and_record(
    runner: ScheduledRunner,
    request: RunRequest,
    *,
    job_id: str,
    fire_time: datetime,
    trigger: FireTrigger,
    request_id: str | None,
    timeout_s: float,
    clock: Clock,
) -> RunRecord:
    """Run ``request``; a runner exception becomes ``error``, a hang becomes ``timeout``."""
    started = clock()
    log.info("scheduler.run_started", job_id=job_id, run_id=request.run_id, session_key=request.session_key)
    try:
        outcome = await asyncio.wait_for(
            runner.run_scheduled(request, timeout_s=timeout_s), timeout_s + RUNNER_GRACE_S
        )
    except TimeoutError:
        outcome = ScheduledOutcome(
            run_id=request.run_id,
            run_status="timeout",
            error=f"no result from the runner after {timeout_s + RUNNER_GRACE_S:.0f}s",
        )
    except Exception as exc:
        log.exception("scheduler.runner_failed", job_id=job_id, run_id=request.run_id)
        outcome = ScheduledOutcome(
            run_id=request.run_id, run_status="error", error=f"{type(exc).__name__}: {exc}"
        )
    run_status, delivery, error = outcome.run_status, outcome.delivery_status, outcome.error
    if run_status not in RUN_STATUSES:
        run_status, error = "error", f"runner reported an unknown run status {run_status!r}"
    if delivery not in DELIVERY_STATUSES:
        delivery = "unknown"
    record = RunRecord(
        job_id=job_id,
        run_id=outcome.run_id or request.run_id,
        fire_time=fire_time,
        trigger=trigger,
        request_id=request_id,
        started_at=started,
        finished_at=clock(),
        run_status=run_status,
        delivery_status=delivery,
        error=clip_error(error),
    )
    log.info(
        "scheduler.run_finished",
        job_id=job_id,
        run_id=record.run_id,
        run_status=record.run_status,
        delivery_status=record.delivery_status,
    )
    return record


DEFAULT_HEARTBEAT_PROMPT = (
    "[Heartbeat] This is a periodic check, not a message from a person. Work through the "
    "checklist from HEARTBEAT.md below and follow it strictly; do not infer or repeat old "
    "tasks from earlier chats. If nothing needs attention, reply HEARTBEAT_OK."
)


def cron_run_request(
    job: CronJob,
    *,
    agent_id: str,
    session_key: str,
    fire_time: datetime,
    trigger: FireTrigger,
    request_id: str | None,
    now: datetime,
) -> RunRequest:
    """The request for one run of ``job``."""
    zone = ZoneInfo(getattr(job.schedule, "tz", "UTC"))
    local = fire_time.astimezone(zone).strftime("%Y-%m-%d %H:%M %Z")
    why = {
        "schedule": "scheduled for",
        "catch_up": "catching up a run missed at",
        "run_now": "run on request at",
    }
    header = (
        f'[Scheduled task] Cron job "{job.id}" ({job.schedule.describe()}), {why[trigger]} {local}. '
        f"Your final reply is delivered to {job.target.describe()}. Do the task below. "
        "If there is nothing worth sending, reply NO_REPLY."
    )
    fire = iso_utc(fire_time)
    meta = {"fresh_session": "1", "job_id": job.id, "fire_time": fire, "trigger": trigger}
    if job.created_by:
        meta["created_by"] = job.created_by
    if request_id:
        meta["request_id"] = request_id
    dedupe = (
        f"cron:{job.id}:run_now:{request_id}"
        if trigger == "run_now" and request_id
        else f"cron:{job.id}:{fire}"
    )
    return RunRequest(
        session_key=session_key,
        agent_id=agent_id,
        channel=job.target.channel,
        chat_id=job.target.chat_id,
        thread_id=job.target.thread_id,
        user_name=f"cron job {job.id}",
        text=f"{header}\n\n{job.prompt}",
        kind="cron",
        prompt_mode="minimal",
        tool_policy=job.tool_policy(),
        received_at=now.timestamp(),
        dedupe_key=dedupe,
        meta=meta,
    )


def heartbeat_run_request(
    *,
    target: JobTarget,
    prompt: str | None,
    checklist: str,
    agent_id: str,
    session_key: str,
    fire_time: datetime,
    trigger: FireTrigger,
    now: datetime,
) -> RunRequest:
    """The request for one heartbeat: the configured (or default) prompt plus HEARTBEAT.md."""
    fire = iso_utc(fire_time)
    text = f"{(prompt or DEFAULT_HEARTBEAT_PROMPT).strip()}\n\nHEARTBEAT.md:\n{checklist}"
    return RunRequest(
        session_key=session_key,
        agent_id=agent_id,
        channel=target.channel,
        chat_id=target.chat_id,
        thread_id=target.thread_id,
        user_name="heartbeat",
        text=text,
        kind="heartbeat",
        prompt_mode="minimal",
        tool_policy=ToolPolicy(context="scheduled", allow=()),
        received_at=now.timestamp(),
        dedupe_key=f"heartbeat:{fire}" if trigger != "run_now" else None,
        meta={"job_id": HEARTBEAT_JOB_ID, "fire_time": fire, "trigger": trigger},
    )


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
            job = await self._claim(job_id, fire_time)
            if job is None:
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
            job = await self._claim(job_id, fire_time)
            if job is None:
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

    async def _claim(self, job_id: str, fire_time: datetime) -> CronJob | None:
        """Claim the fire (once across replicas) and load its job; None when another
        replica has the fire or the job is gone or disabled."""
        if not await self._claims.claim(job_id, fire_time, self._owner):
            return None
        await self._claims.note_fire(job_id, fire_time)
        job = await self._load(job_id)
        if job is None or not job.enabled:
            return None
        return job

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
