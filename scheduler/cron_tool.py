"""The ``cron`` tool: people schedule, list and remove jobs from a chat.

A job made here delivers to the chat (and thread) it was made in, found in
``ToolContext.chat`` (``channel``, ``chat_id``, ``thread_id``); the creator is
``ToolContext.extra["user_id"]`` (or ``"user_name"``) when the daemon provides
it. ``list`` shows the jobs made in or delivering to this chat; ``remove`` only
works for jobs made in this chat. A job may be granted ``write`` tools here;
``admin`` can only be granted from the CLI, because a scheduled run has nobody
to approve admin calls.
"""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo

from agent.tools.registry import Tool, ToolContext, ToolError, ToolOutput
from scheduler.jobs import CronJob, NotYourJobError, build_job, make_target
from scheduler.ports import JobTarget
from scheduler.schedules import Clock, CronError, utc_now
from scheduler.store import JobStore

_ID_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"


class CronTool(Tool):
    """Schedules runs of the agent that report back to this chat."""

    name = "cron"
    category = "write"
    description = (
        "Schedule tasks that run later and report to this chat, list them, or remove them. "
        "action=add needs a prompt (what to do when it runs) and exactly one of: "
        "'in' (e.g. '20m', once after a delay), 'at' (ISO-8601 time, once), "
        "'every' (e.g. '1h', repeating), 'cron' (5-field crontab like '0 9 * * 1-5', weekday 0/7 = Sunday; "
        "optional 'tz' IANA timezone). action=list shows this chat's jobs; action=remove needs 'id'."
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["add", "list", "remove"]},
            "prompt": {
                "type": "string",
                "minLength": 1,
                "maxLength": 8000,
                "description": "What the job should do when it runs (add).",
            },
            "in": {
                "type": "string",
                "maxLength": 32,
                "description": "Run once after this delay, e.g. 20m, 2h.",
            },
            "at": {
                "type": "string",
                "maxLength": 64,
                "description": "Run once at this ISO-8601 time; without an offset it is read in tz.",
            },
            "every": {
                "type": "string",
                "maxLength": 32,
                "description": "Repeat at this interval, e.g. 30m, 1d.",
            },
            "cron": {"type": "string", "maxLength": 128, "description": "5-field crontab expression."},
            "tz": {"type": "string", "maxLength": 64, "description": "IANA timezone for 'at' and 'cron'."},
            "allow": {
                "type": "array",
                "items": {"type": "string", "enum": ["write"]},
                "uniqueItems": True,
                "description": "Extra tool categories the job may use; only 'write' can be granted here.",
            },
            "id": {
                "type": "string",
                "pattern": _ID_PATTERN,
                "description": "Job id: optional name for add, required for remove.",
            },
        },
        "required": ["action"],
        "additionalProperties": False,
    }

    def __init__(
        self,
        store: JobStore,
        *,
        default_timezone: str = "UTC",
        clock: Clock = utc_now,
        max_jobs_per_chat: int = 50,
    ) -> None:
        self._store = store
        self._default_tz = default_timezone
        self._clock = clock
        self._max_jobs = max_jobs_per_chat

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        chat = _chat_of(ctx)
        action = args.get("action")
        try:
            if action == "add":
                return await self._add(args, ctx, chat)
            if action == "list":
                return await self._list(chat)
            if action == "remove":
                return await self._remove(args, chat)
        except CronError as exc:
            raise ToolError(f"Error: {exc}") from None
        raise ToolError(f"Error: unknown action {action!r} (use add, list or remove)")

    async def _add(self, args: dict[str, Any], ctx: ToolContext, chat: JobTarget) -> ToolOutput:
        if "admin" in (args.get("allow") or ()):
            raise ToolError(
                "Error: 'admin' can only be granted from the command line (botd cron add --allow admin)."
            )
        mine = [job for job in await self._store.list() if job.created_in and job.created_in.same_chat(chat)]
        if len(mine) >= self._max_jobs:
            raise ToolError(
                f"Error: this chat already has {len(mine)} cron jobs (limit {self._max_jobs}); remove some first."
            )
        creator = str(ctx.extra.get("user_id") or ctx.extra.get("user_name") or "")
        now = self._clock()
        job = build_job(
            prompt=str(args.get("prompt") or ""),
            target=chat,
            at=args.get("at"),
            in_=args.get("in"),
            every=args.get("every"),
            cron=args.get("cron"),
            tz=args.get("tz"),
            allow=args.get("allow"),
            job_id=args.get("id"),
            created_by=creator,
            created_in=chat,
            default_tz=self._default_tz,
            now=now,
        )
        await self._store.add(job)
        upcoming = job.next_run_at(now)
        when = _local(upcoming, job) if upcoming else "not scheduled"
        return ToolOutput(
            f"Scheduled cron job {job.id!r} ({job.schedule.describe()}); next run {when}. "
            f"Its results will be posted to this chat."
        )

    async def _list(self, chat: JobTarget) -> ToolOutput:
        now = self._clock()
        jobs = [
            job
            for job in await self._store.list()
            if (job.created_in and job.created_in.same_chat(chat)) or job.target.same_chat(chat)
        ]
        if not jobs:
            return ToolOutput("No cron jobs for this chat.")
        lines = []
        for job in jobs:
            upcoming = job.next_run_at(now)
            state = "enabled" if job.enabled else f"disabled ({job.disabled_reason or 'no reason recorded'})"
            last = f"last run {job.last_run.run_status}" if job.last_run else "never run"
            owner = (
                ""
                if job.created_in and job.created_in.same_chat(chat)
                else "; made elsewhere, cannot be removed here"
            )
            prompt = " ".join(job.prompt.split())
            lines.append(
                f"- {job.id}: {job.schedule.describe()}; next {_local(upcoming, job) if upcoming else '-'}; "
                f"{state}; {last}{owner}; prompt: {prompt[:120]}"
            )
        return ToolOutput("\n".join(lines))

    async def _remove(self, args: dict[str, Any], chat: JobTarget) -> ToolOutput:
        job_id = args.get("id")
        if not job_id:
            raise ToolError("Error: remove needs the job 'id' (see action=list).")
        job = await self._store.get(job_id)
        if job is None:
            raise ToolError(f"Error: no cron job with id {job_id!r}.")
        if job.created_in is None or not job.created_in.same_chat(chat):
            where = f"in {job.created_in.describe()}" if job.created_in else "from the command line"
            raise NotYourJobError(
                f"cron job {job_id!r} was created {where}, not in this chat; it can only be removed there "
                f"(or by an operator with `botd cron rm {job_id}`)"
            )
        await self._store.remove(job_id)
        return ToolOutput(f"Removed cron job {job_id!r}.")


def _chat_of(ctx: ToolContext) -> JobTarget:
    try:
        return make_target(ctx.chat.get("channel"), ctx.chat.get("chat_id"), ctx.chat.get("thread_id"))
    except CronError as exc:
        raise ToolError(f"Error: this run has no chat to schedule for ({exc}).") from None


def _local(moment: Any, job: CronJob) -> str:
    tz = ZoneInfo(getattr(job.schedule, "tz", "UTC"))
    return str(moment.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S %Z"))
