"""The RunRequests a fire produces: what the model is told, and where the answer goes.

Scheduled runs use the minimal prompt. The request's ``channel``/``chat_id``/
``thread_id`` are the *delivery target* (not "cron"/"heartbeat"), so the gateway
delivers there; ``kind`` tells it which silent-reply rule applies (NO_REPLY for
cron, HEARTBEAT_OK for heartbeats). ``meta`` carries ``job_id``, ``fire_time``
(ISO UTC), ``trigger`` and, for cron, ``fresh_session="1"`` (every cron run starts
with an empty ``agent:<id>:cron:<job_id>`` session), ``created_by`` and, for a
run-now, ``request_id``. No person is behind a scheduled run, so ``user_id`` is empty.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from agent.types import RunRequest, ToolPolicy
from scheduler.clock import iso_utc
from scheduler.jobs import HEARTBEAT_JOB_ID, CronJob
from scheduler.ledger import FireTrigger
from scheduler.ports import JobTarget

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
