"""The heartbeat: a periodic run that works through HEARTBEAT.md and reports to a chat.

It is the job ``heartbeat``: it fires every ``heartbeat.every`` on a fixed grid
(multiples of the interval since the Unix epoch, so every replica computes the
same fire times) and is claimed like any fire. A fire outside ``active_hours``
does nothing (and is not recorded); an effectively empty HEARTBEAT.md (see
:mod:`scheduler.heartbeat_file`) is recorded as skipped without an LLM call.
While the heartbeat session or one of the extra "busy" sessions (the target
chat's session, supplied by the daemon) is busy, the heartbeat waits
``busy_retry_s`` and asks again, at most ``busy_max_retries`` times and never
past the next fire; then it is recorded as skipped. A run-now ignores the
active hours but not an empty file or a busy session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import structlog
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.interval import IntervalTrigger

from scheduler.claims import FireClaims
from scheduler.clock import Clock, iso_utc
from scheduler.execution import run_and_record
from scheduler.heartbeat_file import clip_heartbeat_text, is_effectively_empty, read_heartbeat_file
from scheduler.jobs import HEARTBEAT_JOB_ID
from scheduler.ledger import FireTrigger, RunLedger, RunRecord
from scheduler.ports import ScheduledRunner
from scheduler.run_requests import heartbeat_run_request
from scheduler.settings import HeartbeatSettings

log = structlog.get_logger(__name__)

HEARTBEAT_ANCHOR = datetime(1970, 1, 1, tzinfo=UTC)
EMPTY_REASON = "HEARTBEAT.md is empty (only headings, comments or blank items): nothing to check"
Sleep = Callable[[float], Awaitable[None]]


class HeartbeatFires:
    """Runs the heartbeat for one replica."""

    job_id = HEARTBEAT_JOB_ID

    def __init__(
        self,
        settings: HeartbeatSettings,
        claims: FireClaims,
        ledger: RunLedger,
        runner: ScheduledRunner,
        *,
        workspace: Path,
        agent_id: str,
        session_key: str,
        busy_keys: Sequence[str] = (),
        clock: Clock,
        owner: str,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self._claims = claims
        self._ledger = ledger
        self._runner = runner
        self._workspace = workspace
        self._agent_id = agent_id
        self._session_key = session_key
        self._busy_keys = (session_key, *busy_keys)
        self._clock = clock
        self._owner = owner
        self._sleep = sleep

    def trigger(self) -> BaseTrigger:
        return IntervalTrigger(seconds=self.settings.every_s, start_date=HEARTBEAT_ANCHOR, timezone=UTC)

    async def fire(self, fire_time: datetime, *, trigger: FireTrigger = "schedule") -> RunRecord | None:
        """A scheduled or caught-up fire; None when another replica has it or it is out of hours."""
        if not await self._claims.claim(self.job_id, fire_time, self._owner):
            return None
        await self._claims.note_fire(self.job_id, fire_time)
        window = self.settings.window
        if window is not None and not (
            window.contains(fire_time) and (trigger != "catch_up" or window.contains(self._clock()))
        ):
            log.debug("heartbeat.outside_active_hours", fire_time=iso_utc(fire_time))
            return None
        return await self._attempt(fire_time, trigger, None)

    async def skip_missed(self, fire_time: datetime, reason: str) -> RunRecord | None:
        """Record a missed fire as skipped (catch_up: skip), once across replicas."""
        if not await self._claims.claim(self.job_id, fire_time, self._owner):
            return None
        await self._claims.note_fire(self.job_id, fire_time)
        return await self._skip(reason, fire_time, "catch_up", None)

    async def run_now(self, *, request_id: str | None = None) -> RunRecord:
        """Run immediately (active hours ignored)."""
        now = self._clock()
        if not self.settings.enabled or self.settings.target is None:
            return await self._skip(
                "the heartbeat is disabled (heartbeat.enabled)", now, "run_now", request_id
            )
        return await self._attempt(now, "run_now", request_id)

    async def _attempt(self, fire_time: datetime, trigger: FireTrigger, request_id: str | None) -> RunRecord:
        if is_effectively_empty(read_heartbeat_file(self._workspace)):
            return await self._skip(EMPTY_REASON, fire_time, trigger, request_id)
        if not await self._wait_until_idle(fire_time):
            return await self._skip("the target session stayed busy", fire_time, trigger, request_id)
        checklist = read_heartbeat_file(self._workspace)  # it may have changed while waiting
        if is_effectively_empty(checklist):
            return await self._skip(EMPTY_REASON, fire_time, trigger, request_id)
        target = self.settings.target
        assert target is not None  # enabled settings always carry a target
        request = heartbeat_run_request(
            target=target,
            prompt=self.settings.prompt,
            checklist=clip_heartbeat_text(checklist),
            agent_id=self._agent_id,
            session_key=self._session_key,
            fire_time=fire_time,
            trigger=trigger,
            now=self._clock(),
        )
        record = await run_and_record(
            self._runner,
            request,
            job_id=self.job_id,
            fire_time=fire_time,
            trigger=trigger,
            request_id=request_id,
            timeout_s=self.settings.timeout_s,
            clock=self._clock,
        )
        await self._ledger.append(record)
        return record

    async def _wait_until_idle(self, fire_time: datetime) -> bool:
        deadline = fire_time + timedelta(seconds=self.settings.every_s)
        retry = self.settings.busy_retry_s
        for attempt in range(self.settings.busy_max_retries + 1):
            if not await self._busy():
                return True
            if (
                attempt == self.settings.busy_max_retries
                or self._clock() + timedelta(seconds=retry) >= deadline
            ):
                return False
            log.info("heartbeat.deferred", attempt=attempt + 1, retry_s=retry)
            await self._sleep(retry)
        return False

    async def _busy(self) -> bool:
        for key in self._busy_keys:
            try:
                if await self._runner.is_busy(key):
                    return True
            except Exception:
                # A failing check must not silence heartbeats; the gateway still serializes runs.
                log.exception("heartbeat.busy_check_failed", session_key=key)
        return False

    async def _skip(
        self, reason: str, fire_time: datetime, trigger: FireTrigger, request_id: str | None
    ) -> RunRecord:
        record = RunLedger.skipped(
            self.job_id, reason, at=self._clock(), fire_time=fire_time, trigger=trigger, request_id=request_id
        )
        await self._ledger.append(record)
        log.info("heartbeat.skipped", reason=reason)
        return record
