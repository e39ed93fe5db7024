"""A cron job as stored in Redis: schedule, prompt, delivery target, policy and state."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Literal

from apscheduler.triggers.base import BaseTrigger
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent.types import ToolPolicy
from scheduler.fire_times import effective_trigger, next_fire
from scheduler.ledger import RunRecord
from scheduler.ports import JobTarget
from scheduler.schedules import Schedule

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
