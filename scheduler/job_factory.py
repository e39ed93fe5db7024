"""Turn what a person typed (CLI options or cron tool arguments) into a valid CronJob."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pydantic import ValidationError

from scheduler.errors import InvalidJobError
from scheduler.jobs import MAX_PROMPT_CHARS, CronJob, new_job_id, parse_grants, validate_job_id
from scheduler.ports import JobTarget
from scheduler.schedules import build_schedule


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
