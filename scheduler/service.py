"""The scheduler service: heartbeat and cron jobs on APScheduler, once across replicas.

Every replica runs one :class:`SchedulerService` with an ``AsyncIOScheduler`` in
the daemon's event loop and schedules every job; each fire is claimed in Redis
(:class:`scheduler.store.FireClaims`) so exactly one replica runs it. APScheduler 3
calls a job function without its scheduled run time, but a claim must be keyed by
exactly that time: :class:`FireTimeExecutor` (a custom executor, the extension point
APScheduler documents) passes it as ``fire_time``.

Keeping replicas in step: job changes are announced on ``<prefix>:cron:changes``
(:mod:`scheduler.store`) and applied at once, through the process's one pub/sub
listener (a :class:`scheduler.ports.Subscriber`); after that listener reconnects, and
every ``resync_interval_s`` (30 s), a full resync repairs anything a lost message left
behind, and also drains run-now requests.

Missed fires: when a replica first sees a job (at start-up, or a job created
while it was away) it looks for the latest fire between the job's last recorded
fire (or its creation) and now. With ``scheduler.catch_up: once`` that one fire
runs now, however many were missed (never a burst); with ``skip`` it is recorded
as skipped (a one-shot job is then kept, disabled). A fire that arrives more than
``misfire_grace_s`` late while running (a suspended host) follows the same rule.
The heartbeat counts missed fires only once a fire has been recorded.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog
from apscheduler.executors.base import BaseExecutor
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.base import BaseTrigger

from agent.tasks import TaskSet, cancel_all, drain
from scheduler.fires import CronFires
from scheduler.heartbeat import HeartbeatFires
from scheduler.jobs import (
    HEARTBEAT_JOB_ID,
    CorruptJobError,
    CronJob,
    FireTrigger,
    JobNotFoundError,
    RunRecord,
)
from scheduler.ports import CronKeys, GrantSeal, ScheduledRunner, Subscriber
from scheduler.schedules import Clock, format_duration, iso_utc, latest_fire_between, next_fire, utc_now
from scheduler.settings import HeartbeatSettings, SchedulerSettings
from scheduler.store import FireClaims, JobStore, RunLedger

log = structlog.get_logger(__name__)


class FireTimeExecutor(BaseExecutor):
    """Runs coroutine jobs as tasks, passing the scheduled time as ``fire_time``."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, scheduler: Any, alias: str) -> None:
        super().start(scheduler, alias)
        self._loop = asyncio.get_running_loop()

    def shutdown(self, wait: bool = True) -> None:
        # The scheduler service drains or cancels the tasks itself (it can await; this cannot).
        return None

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        assert self._loop is not None, "executor not started"
        fire_time = run_times[-1]
        task = self._loop.create_task(job.func(*job.args, fire_time=fire_time, **job.kwargs))
        self.tasks.add(task)
        job_id = job.id

        def done(finished: asyncio.Task[Any]) -> None:
            self.tasks.discard(finished)
            if finished.cancelled() or finished.exception() is None:
                self._run_job_success(job_id, [])
            else:
                error = finished.exception()
                self._run_job_error(job_id, error, error.__traceback__ if error else None)

        task.add_done_callback(done)


_TICK = timedelta(microseconds=1)


class SchedulerService:
    """Heartbeat + cron for one replica. ``start()`` in the daemon's loop, ``stop()`` on shutdown."""

    def __init__(
        self,
        redis: Any,
        keys: CronKeys,
        runner: ScheduledRunner,
        *,
        signals: Subscriber,
        heartbeat: HeartbeatSettings,
        settings: SchedulerSettings,
        workspace: Path,
        session_key_for_job: Callable[[str], str],
        heartbeat_session_key: str,
        agent_id: str = "main",
        heartbeat_busy_keys: Sequence[str] = (),
        clock: Clock = utc_now,
        instance_id: str | None = None,
        seal: GrantSeal | None = None,
    ) -> None:
        self._redis = redis
        self.settings = settings
        self.instance_id = instance_id or uuid.uuid4().hex[:12]
        self._clock = clock
        self.store = JobStore(redis, keys, seal)
        self._claims = FireClaims(redis, keys, ttl_s=settings.fire_claim_ttl_s)
        self._cron = CronFires(
            self.store,
            self._claims,
            runner,
            agent_id=agent_id,
            session_key_for_job=session_key_for_job,
            run_timeout_s=settings.run_timeout_s,
            clock=clock,
            owner=self.instance_id,
        )
        self._heartbeat = HeartbeatFires(
            heartbeat,
            self._claims,
            self.store.ledger,
            runner,
            workspace=workspace,
            agent_id=agent_id,
            session_key=heartbeat_session_key,
            busy_keys=heartbeat_busy_keys,
            clock=clock,
            owner=self.instance_id,
        )
        self._scheduler: AsyncIOScheduler | None = None
        self._executor: FireTimeExecutor | None = None
        self._known: dict[str, str] = {}
        self._sync_lock = asyncio.Lock()
        self._tasks = TaskSet()
        self._background: list[asyncio.Task[Any]] = []
        self._stopping = False
        # Subscribed before the listener starts (the daemon starts it before this service),
        # so no change can slip between the subscription and the first load in start().
        signals.on(self.store.changes_channel, self._on_change)
        signals.on_reconnect(self._on_reconnect)

    @property
    def ledger(self) -> RunLedger:
        return self.store.ledger

    @property
    def running(self) -> bool:
        return self._scheduler is not None

    async def start(self) -> None:
        """Subscribe to changes, schedule the heartbeat and every job, catch up missed fires."""
        if self._scheduler is not None:
            raise RuntimeError("scheduler already started")
        self._executor = FireTimeExecutor()
        self._stopping = False
        self._scheduler = AsyncIOScheduler(
            timezone=UTC,
            executors={"default": self._executor},
            job_defaults={"coalesce": True, "max_instances": 8, "misfire_grace_time": None},
        )
        self._scheduler.start()
        if self._heartbeat.settings.enabled:
            await self._schedule_heartbeat()
        await self.resync()
        await self.drain_run_now()
        self._background = [asyncio.create_task(self._resync_loop(), name="scheduler-resync")]
        log.info("scheduler.started", instance=self.instance_id, jobs=len(self._known))

    async def stop(self, grace_s: float = 30.0) -> None:
        """Stop firing; let runs in progress finish for up to ``grace_s``, then cancel them."""
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is None:
            return
        self._stopping = True
        await cancel_all(self._background)
        self._background = []
        scheduler.shutdown(wait=False)
        await drain(self._tasks.tasks | (self._executor.tasks if self._executor else set()), grace_s)
        self._known.clear()
        log.info("scheduler.stopped", instance=self.instance_id)

    async def run_now(self, job_id: str, *, request_id: str | None = None) -> RunRecord:
        """Run a job (or ``heartbeat``) in this process now; JobNotFoundError for unknown ids."""
        if job_id == HEARTBEAT_JOB_ID:
            return await self._heartbeat.run_now(request_id=request_id)
        return await self._cron.run_now(job_id, request_id=request_id)

    def next_fire_time(self, job_id: str) -> datetime | None:
        """When this replica will next fire ``job_id`` (None when not scheduled)."""
        job = self._scheduler.get_job(job_id) if self._scheduler else None
        return job.next_run_time if job is not None else None

    def scheduled_job_ids(self) -> list[str]:
        return sorted(job.id for job in self._scheduler.get_jobs()) if self._scheduler else []

    async def resync(self) -> None:
        """Make the local schedule match the store (adds, reschedules, removes)."""
        async with self._sync_lock:
            jobs = await self.store.list()
            present = {job.id for job in jobs}
            for job in jobs:
                await self._sync_job(job)
            for job_id in [j for j in self._known if j not in present]:
                self._unschedule(job_id)

    async def sync_job(self, job_id: str) -> None:
        """Apply the stored state of one job (after a change notification)."""
        async with self._sync_lock:
            try:
                job = await self.store.get(job_id)
            except CorruptJobError as exc:
                log.error("cron.job_unreadable", job_id=job_id, error=str(exc))
                job = None
            if job is None:
                self._unschedule(job_id)
            else:
                await self._sync_job(job)

    async def drain_run_now(self) -> None:
        """Take every pending run-now request; each is handed to exactly one replica."""
        while self._scheduler is not None and (request := await self.store.run_now_queue.pop()) is not None:
            age = (self._clock() - request.requested_at).total_seconds()
            if age > self.settings.run_now_max_age_s:
                reason = f"run-now request expired: made {format_duration(age)} ago with no scheduler running"
                await self.ledger.append(
                    RunLedger.skipped(
                        request.job_id,
                        reason,
                        at=self._clock(),
                        fire_time=None,
                        trigger="run_now",
                        request_id=request.request_id,
                    )
                )
                continue
            log.info("scheduler.run_now", job_id=request.job_id, request_id=request.request_id)
            self._tasks.spawn(self._run_requested(request.job_id, request.request_id))

    async def _run_requested(self, job_id: str, request_id: str) -> None:
        try:
            await self.run_now(job_id, request_id=request_id)
        except JobNotFoundError:
            log.warning("scheduler.run_now_unknown_job", job_id=job_id, request_id=request_id)

    # -- scheduling -------------------------------------------------------------------------

    async def _schedule_heartbeat(self) -> None:
        trigger = self._heartbeat.trigger()
        now = self._clock()
        upcoming = next_fire(trigger, now)
        self._add(HEARTBEAT_JOB_ID, trigger, upcoming, self._on_heartbeat_fire)
        last = await self._claims.last_fire(HEARTBEAT_JOB_ID)
        if last is None:
            await self._claims.note_baseline(HEARTBEAT_JOB_ID, now)
            return
        missed = latest_fire_between(trigger, last, upcoming or now + _TICK)
        if missed is not None:
            self._handle_missed(HEARTBEAT_JOB_ID, missed, now)

    async def _sync_job(self, job: CronJob) -> None:
        signature = job.schedule_signature()
        if not job.enabled:
            self._unschedule(job.id)
            return
        if self._known.get(job.id) == signature:
            return
        first_sight = job.id not in self._known
        self._known[job.id] = signature
        trigger = job.trigger()
        now = self._clock()
        upcoming = next_fire(trigger, now)
        if upcoming is None:
            self._remove_local(job.id)
        else:
            self._add(job.id, trigger, upcoming, self._on_cron_fire)
        if first_sight:
            last = await self._claims.last_fire(job.id)
            floor = max(last, job.created_at) if last else job.created_at
            missed = latest_fire_between(trigger, floor, upcoming or now + _TICK)
            if missed is not None:
                self._handle_missed(job.id, missed, now)

    def _add(
        self,
        job_id: str,
        trigger: BaseTrigger,
        upcoming: datetime | None,
        func: Callable[..., Coroutine[Any, Any, None]],
    ) -> None:
        if self._scheduler is None:
            return
        if upcoming is None:
            self._remove_local(job_id)
            return
        self._scheduler.add_job(
            func,
            trigger=trigger,
            args=[job_id],
            id=job_id,
            name=job_id,
            next_run_time=upcoming,
            replace_existing=True,
        )

    def _unschedule(self, job_id: str) -> None:
        self._known.pop(job_id, None)
        self._remove_local(job_id)

    def _remove_local(self, job_id: str) -> None:
        if self._scheduler is not None and self._scheduler.get_job(job_id) is not None:
            self._scheduler.remove_job(job_id)

    def _handle_missed(self, job_id: str, fire_time: datetime, now: datetime) -> None:
        late_s = (now - fire_time).total_seconds()
        if late_s <= self.settings.misfire_grace_s or self.settings.catch_up == "once":
            log.info("scheduler.catch_up", job_id=job_id, fire_time=iso_utc(fire_time))
            self._tasks.spawn(self._fire(job_id, fire_time, catch_up=True))
        else:
            self._tasks.spawn(self._skip(job_id, fire_time, late_s))

    # -- fires ------------------------------------------------------------------------------

    async def _on_cron_fire(self, job_id: str, fire_time: datetime | None = None) -> None:
        await self._on_fire(job_id, fire_time)

    async def _on_heartbeat_fire(self, job_id: str, fire_time: datetime | None = None) -> None:
        await self._on_fire(job_id, fire_time)

    async def _on_fire(self, job_id: str, fire_time: datetime | None) -> None:
        if fire_time is None:
            return
        late_s = (self._clock() - fire_time).total_seconds()
        if late_s > self.settings.misfire_grace_s and self.settings.catch_up == "skip":
            await self._skip(job_id, fire_time, late_s)
        else:
            await self._fire(job_id, fire_time, catch_up=False)

    async def _fire(self, job_id: str, fire_time: datetime, *, catch_up: bool) -> None:
        trigger: FireTrigger = "catch_up" if catch_up else "schedule"
        try:
            if job_id == HEARTBEAT_JOB_ID:
                await self._heartbeat.fire(fire_time, trigger=trigger)
            else:
                await self._cron.fire(job_id, fire_time, trigger=trigger)
        except Exception:
            log.exception("scheduler.fire_failed", job_id=job_id, fire_time=iso_utc(fire_time))

    async def _skip(self, job_id: str, fire_time: datetime, late_s: float) -> None:
        reason = f"missed by {format_duration(late_s)} (scheduler.catch_up: skip)"
        log.info("scheduler.missed_skipped", job_id=job_id, fire_time=iso_utc(fire_time))
        try:
            if job_id == HEARTBEAT_JOB_ID:
                await self._heartbeat.skip_missed(fire_time, reason)
            else:
                await self._cron.skip_missed(job_id, fire_time, reason)
        except Exception:
            log.exception("scheduler.fire_failed", job_id=job_id, fire_time=iso_utc(fire_time))

    # -- keeping in step ---------------------------------------------------------------------

    async def _on_change(self, message: dict[str, Any]) -> None:
        if self._scheduler is None:
            return  # not started (or stopped): start() loads everything anyway
        if not isinstance(message, dict):
            log.warning("scheduler.bad_change_message")
            return
        op, job_id = message.get("op"), message.get("id")
        if op in ("upsert", "remove") and isinstance(job_id, str):
            await self.sync_job(job_id)
        elif op == "run_now":
            await self.drain_run_now()

    async def _on_reconnect(self) -> None:
        """Changes published while the listener was disconnected are lost: resync."""
        if self._scheduler is not None:
            await self.resync()

    async def _resync_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.settings.resync_interval_s)
            try:
                await self.resync()
                await self.drain_run_now()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("scheduler.resync_failed")
