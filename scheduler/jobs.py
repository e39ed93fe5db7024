"""A cron job: what it is, how it is made from what a person typed, and what a finished
run does to it.

``CronJob`` is the job as stored in Redis: schedule, prompt, delivery target, policy
and state. ``RunRecord`` is one fire of a job in the run ledger: ``run_status`` (did
the run do its work) and ``delivery_status`` (did its output reach the chat) are kept
apart. ``build_job`` / ``make_target`` turn CLI options or cron tool arguments into a
valid job; the errors below (all :class:`~scheduler.schedules.CronError`) name what to fix.

What a finished run does to its job (``apply_run``): failures (``error`` or
``timeout``) push the next run back by 30 s, 1 m, 5 m, 15 m, then 60 m for every
further failure, counted from the end of the failed run; a success resets the streak.
The tenth failure in a row disables the job (the caller tells the target chat, once:
only the enabling->disabled transition reports ``disabled_now``). A failed one-shot job
is retried at the back-off time until it succeeds or is disabled; a successful one-shot
is removed; a one-shot whose only fire was skipped is kept, disabled, so it stays
visible in the list. A manual run-now that succeeds re-enables a job that failures had
disabled; one that fails counts in the streak but sets no back-off floor, so it never
moves the job's own next fire (a one-shot still runs at its time). Delivery problems
never count: only ``run_status`` matters here.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from apscheduler.triggers.base import BaseTrigger
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agent.types import DeliveryStatus, ToolPolicy
from scheduler.ports import JobTarget, ScheduledRunStatus
from scheduler.schedules import CronError, Schedule, build_schedule, effective_trigger, next_fire


class JobNotFoundError(CronError, KeyError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"no cron job with id {job_id!r}")
        self.job_id = job_id

    def __str__(self) -> str:
        return str(self.args[0])


class DuplicateJobError(CronError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"a cron job with id {job_id!r} already exists")
        self.job_id = job_id


class CorruptJobError(CronError):
    """A stored job no longer parses (hand-edited or from an incompatible version)."""


class NotYourJobError(CronError):
    """A chat tried to change a job that belongs to another chat."""


class InvalidJobError(CronError):
    """A job definition (id, prompt, target, allow) that cannot be stored."""


class SchedulerNotRunningError(CronError):
    """A request that only a running daemon can serve, made while none listens."""


FireTrigger = Literal["schedule", "catch_up", "run_now"]
MAX_ERROR_CHARS = 2000


class RunRecord(BaseModel):
    """One fire of a job: when, why, what became of the run and of its delivery."""

    model_config = ConfigDict(extra="ignore")

    job_id: str
    run_id: str | None = None
    fire_time: datetime | None = None
    trigger: FireTrigger = "schedule"
    request_id: str | None = None
    started_at: datetime
    finished_at: datetime
    run_status: ScheduledRunStatus
    delivery_status: DeliveryStatus = "unknown"
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.run_status in ("error", "timeout")


def clip_error(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…"


HEARTBEAT_JOB_ID = "heartbeat"
RESERVED_JOB_IDS = frozenset({HEARTBEAT_JOB_ID})
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
MAX_PROMPT_CHARS = 8000
Grant = Literal["write", "admin"]
_GRANT_ORDER: tuple[Grant, ...] = ("write", "admin")


def validate_job_id(job_id: str) -> str:
    """A job id usable in Redis keys and on a command line; ValueError says why not."""
    text = str(job_id).strip()
    if not JOB_ID_RE.fullmatch(text):
        raise ValueError(
            f"job id {text!r} is not valid: use 1-64 letters, digits, '-' or '_', starting with a letter or digit"
        )
    if text.lower() in RESERVED_JOB_IDS:
        raise ValueError(f"job id {text!r} is reserved")
    return text


def new_job_id() -> str:
    return uuid.uuid4().hex[:10]


def parse_grants(value: str | list[str] | tuple[str, ...] | None) -> tuple[Grant, ...]:
    """``"write,admin"`` or a list -> the canonical tuple; ``read`` is always allowed and dropped."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    grants: set[str] = set()
    for item in items:
        name = str(item).strip().lower()
        if not name or name == "read":
            continue
        if name not in _GRANT_ORDER:
            raise ValueError(f"allow: unknown tool category {name!r} (use write, admin)")
        grants.add(name)
    return tuple(g for g in _GRANT_ORDER if g in grants)


class CronJob(BaseModel):
    """Everything about one job; ``not_before`` is the back-off floor after failures."""

    model_config = ConfigDict(extra="forbid")

    id: str
    schedule: Schedule
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    target: JobTarget
    allow: tuple[Grant, ...] = ()
    grants_mac: str = ""  # set by JobStore: binds allow to the job (see scheduler.store)
    created_by: str = ""
    created_in: JobTarget | None = None
    created_at: datetime
    enabled: bool = True
    failure_streak: int = Field(default=0, ge=0)
    not_before: datetime | None = None
    disabled_reason: str | None = None
    last_run: RunRecord | None = None

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        return validate_job_id(value)

    @field_validator("allow", mode="before")
    @classmethod
    def _allow(cls, value: object) -> object:
        if value is None or isinstance(value, str | list | tuple):
            return parse_grants(value)
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("prompt is empty")
        return value

    def tool_policy(self) -> ToolPolicy:
        return ToolPolicy(context="scheduled", allow=self.allow)

    def trigger(self) -> BaseTrigger:
        """The trigger to schedule now, back-off included."""
        return effective_trigger(
            self.schedule.trigger(), one_shot=self.schedule.one_shot, not_before=self.not_before
        )

    def next_run_at(self, now: datetime) -> datetime | None:
        """When it fires next (None when disabled or nothing is left to run)."""
        if not self.enabled:
            return None
        return next_fire(self.trigger(), now)

    def schedule_signature(self) -> str:
        """Changes whenever the fire times this job should have change."""
        floor = self.not_before.isoformat() if self.not_before else "-"
        return f"{self.enabled}|{floor}|{self.schedule.model_dump_json()}"


BACKOFF_LADDER_S: tuple[float, ...] = (30.0, 60.0, 300.0, 900.0, 3600.0)
MAX_CONSECUTIVE_FAILURES = 10


def backoff_s(streak: int) -> float:
    """Delay after the ``streak``-th failure in a row (1-based)."""
    if streak < 1:
        return 0.0
    return BACKOFF_LADDER_S[min(streak, len(BACKOFF_LADDER_S)) - 1]


@dataclass(frozen=True)
class Transition:
    job: CronJob
    disabled_now: bool = False
    remove: bool = False


def apply_run(job: CronJob, record: RunRecord) -> Transition:
    """The job after ``record`` (a pure function: safe to retry inside a transaction)."""
    job = job.model_copy(update={"last_run": record})
    if record.failed:
        streak = job.failure_streak + 1
        updates: dict[str, object] = {"failure_streak": streak}
        if record.trigger != "run_now":
            # A manual run never moves the schedule: back-off only delays scheduled fires.
            updates["not_before"] = record.finished_at + timedelta(seconds=backoff_s(streak))
        disabled_now = streak >= MAX_CONSECUTIVE_FAILURES and job.enabled
        if disabled_now:
            updates["enabled"] = False
            updates["disabled_reason"] = f"disabled after {streak} failed runs in a row"
        return Transition(job.model_copy(update=updates), disabled_now=disabled_now)
    if record.run_status == "ok":
        updates = {"failure_streak": 0, "not_before": None}
        if record.trigger == "run_now" and not job.enabled and job.failure_streak >= MAX_CONSECUTIVE_FAILURES:
            updates.update(enabled=True, disabled_reason=None)
        done = job.schedule.one_shot and record.trigger != "run_now"
        return Transition(job.model_copy(update=updates), remove=done)
    if job.schedule.one_shot and record.trigger != "run_now" and job.enabled:
        reason = f"its run was skipped: {record.error or 'no reason given'}"
        return Transition(job.model_copy(update={"enabled": False, "disabled_reason": reason}))
    return Transition(job)


def disabled_notice(job: CronJob, record: RunRecord) -> str:
    """The one message the target chat gets when failures disable a job."""
    error = (record.error or record.run_status).strip()
    if len(error) > 300:
        error = error[:300] + "…"
    return (
        f"Cron job {job.id!r} ({job.schedule.describe()}) was disabled after "
        f"{MAX_CONSECUTIVE_FAILURES} failed runs in a row. Last error: {error}. "
        f"Remove it with `botd cron rm {job.id}` or ask me to remove it; "
        f"a successful `botd cron run-now {job.id}` turns it back on."
    )


def make_target(channel: str | None, chat_id: str | None, thread_id: str | None = None) -> JobTarget:
    """A delivery target; InvalidJobError names the bad part."""
    if not channel:
        raise InvalidJobError("channel: required (telegram or slack)")
    if channel == "console":
        # `botd chat` runs no scheduler and `botd run` has no console: nothing could ever deliver.
        raise InvalidJobError(
            "channel: console cannot receive scheduled runs (botd chat runs no scheduler); use telegram or slack"
        )
    if channel not in ("telegram", "slack"):
        raise InvalidJobError(f"channel: {channel!r} is not a chat channel (use telegram or slack)")
    if chat_id is None or not str(chat_id).strip():
        raise InvalidJobError("chat-id: required")
    try:
        return JobTarget.model_validate(
            {"channel": channel, "chat_id": str(chat_id).strip(), "thread_id": thread_id or None}
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidJobError(f"{first['loc'][0]}: {first['msg']}") from None


def build_job(
    *,
    prompt: str,
    target: JobTarget,
    at: str | None = None,
    in_: str | None = None,
    every: str | None = None,
    cron: str | None = None,
    tz: str | None = None,
    allow: str | Sequence[str] | None = None,
    job_id: str | None = None,
    created_by: str = "",
    created_in: JobTarget | None = None,
    default_tz: str = "UTC",
    now: datetime,
) -> CronJob:
    """A new job; ScheduleError / InvalidJobError (both CronError) explain what to fix."""
    schedule = build_schedule(at=at, in_=in_, every=every, cron=cron, tz=tz, default_tz=default_tz, now=now)
    text = (prompt or "").strip()
    if not text:
        raise InvalidJobError("prompt: required (what should the job do?)")
    if len(text) > MAX_PROMPT_CHARS:
        raise InvalidJobError(f"prompt: too long ({len(text)} characters, at most {MAX_PROMPT_CHARS})")
    try:
        grants = parse_grants(list(allow) if allow is not None and not isinstance(allow, str) else allow)
        ident = validate_job_id(job_id) if job_id else new_job_id()
    except ValueError as exc:
        raise InvalidJobError(str(exc)) from None
    return CronJob(
        id=ident,
        schedule=schedule,
        prompt=text,
        target=target,
        allow=grants,
        created_by=created_by,
        created_in=created_in,
        created_at=now.replace(microsecond=0),
    )
