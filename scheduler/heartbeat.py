"""The heartbeat: a periodic run that works through HEARTBEAT.md and reports to a chat.

It is the job ``heartbeat``: it fires every ``heartbeat.every`` on a fixed grid
(multiples of the interval since the Unix epoch, so every replica computes the
same fire times) and is claimed like any fire. A fire outside ``active_hours``
does nothing (and is not recorded); an effectively empty HEARTBEAT.md is recorded
as skipped without an LLM call. While the heartbeat session or one of the extra
"busy" sessions (the target chat's session, supplied by the daemon) is busy, the
heartbeat waits ``busy_retry_s`` and asks again, at most ``busy_max_retries`` times
and never past the next fire; then it is recorded as skipped. A run-now ignores the
active hours but not an empty file or a busy session.

Active hours are a daily window, e.g. ``09:00-22:00`` in a given IANA timezone. The
end is exclusive, ``24:00`` is allowed as an end, and a window whose end is before its
start crosses midnight (``22:00-06:00`` is 22:00 until 06:00 next day). Membership is
read on the wall clock, like a cron job's ``*`` fields: both passes of a repeated hour
count, a wall time skipped by a change never happens.

HEARTBEAT.md is "empty" when it holds only structure (headings, HTML comments, blank
lines, horizontal rules, list bullets or checkboxes with nothing after them): that
gives the model nothing to do. A missing file counts as empty.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

import structlog
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.interval import IntervalTrigger

from scheduler.fires import heartbeat_run_request, run_and_record
from scheduler.jobs import HEARTBEAT_JOB_ID, FireTrigger, RunRecord
from scheduler.ports import ScheduledRunner
from scheduler.schedules import Clock, iso_utc
from scheduler.store import FireClaims, RunLedger

if TYPE_CHECKING:
    from scheduler.settings import HeartbeatSettings

log = structlog.get_logger(__name__)


_WINDOW = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")
_DAY_S = 24 * 3600


@dataclass(frozen=True)
class ActiveHours:
    """Seconds-of-day bounds in ``timezone``; ``start_s`` inclusive, ``end_s`` exclusive."""

    start_s: int
    end_s: int
    timezone: ZoneInfo

    @classmethod
    def parse(cls, text: str, timezone: str | ZoneInfo) -> ActiveHours:
        """Parse ``HH:MM-HH:MM``; raises ValueError naming what is wrong."""
        match = _WINDOW.match(text or "")
        if not match:
            raise ValueError(f'active_hours must look like "09:00-22:00", got {text!r}')
        sh, sm, eh, em = (int(g) for g in match.groups())
        if sm > 59 or em > 59:
            raise ValueError(f"active_hours {text!r}: minutes must be 00-59")
        if sh > 23:
            raise ValueError(f"active_hours {text!r}: the start hour must be 00-23")
        if eh > 24 or (eh == 24 and em != 0):
            raise ValueError(f"active_hours {text!r}: the end must be at most 24:00")
        start, end = (sh * 60 + sm) * 60, (eh * 60 + em) * 60
        if start == end:
            raise ValueError(f"active_hours {text!r}: start and end are the same time")
        tz = timezone if isinstance(timezone, ZoneInfo) else ZoneInfo(timezone)
        return cls(start_s=start, end_s=end, timezone=tz)

    def contains(self, moment: datetime) -> bool:
        """Whether the aware ``moment`` falls inside the window (local wall clock)."""
        local = moment.astimezone(self.timezone)
        second = local.hour * 3600 + local.minute * 60 + local.second
        if self.start_s < self.end_s:
            return self.start_s <= second < self.end_s
        return second >= self.start_s or second < self.end_s

    def describe(self) -> str:
        def hhmm(seconds: int) -> str:
            return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}"

        return f"{hhmm(self.start_s)}-{hhmm(self.end_s)} {self.timezone.key}"


HEARTBEAT_FILE = "HEARTBEAT.md"
MAX_HEARTBEAT_CHARS = 16_000

_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
_HEADING = re.compile(r"^#{1,6}(?:\s.*)?$")
_RULE_OR_UNDERLINE = re.compile(r"^(?:[-=*_]\s*){3,}$|^=+$")
_EMPTY_ITEM = re.compile(r"^(?:[-*+]|\d{1,9}[.)])(?:\s+\[[ xX]?\])?\s*$")
_LIST_ITEM = re.compile(r"^(?:[-*+]|\d{1,9}[.)])\s")
_SETEXT_UNDERLINE = re.compile(r"^(?:=+|-+)$")


def read_heartbeat_file(workspace: Path) -> str:
    """The text of ``<workspace>/HEARTBEAT.md``, or ``""`` when it does not exist."""
    path = workspace / HEARTBEAT_FILE
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    except IsADirectoryError:
        return ""


def is_effectively_empty(text: str) -> bool:
    """True when ``text`` has no actionable line (see the module docstring)."""
    lines = [raw.strip() for raw in _COMMENT.sub("", text).splitlines()]
    for index, line in enumerate(lines):
        if not line:
            continue
        if _HEADING.match(line) or _RULE_OR_UNDERLINE.match(line) or _EMPTY_ITEM.match(line):
            continue
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if _SETEXT_UNDERLINE.match(following) and not _LIST_ITEM.match(line):
            continue  # "Title" underlined with === or --- is a heading
        return False
    return True


def clip_heartbeat_text(text: str, limit: int = MAX_HEARTBEAT_CHARS) -> str:
    """The file content for the prompt, cut with a notice when it is very long."""
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[HEARTBEAT.md truncated: {limit} of {len(text)} characters shown]"


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
