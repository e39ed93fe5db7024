"""What ``botd cron add|list|rm|run-now|next`` do, minus the argument parsing and printing.

The daemon's CLI parses options, builds a :class:`~scheduler.store.JobStore` on
the configured Redis and calls these; every failure is a
:class:`~scheduler.schedules.CronError` whose message is ready to print. Changes
reach running daemons through the store's change channel; ``run-now`` goes
through the run-now queue (see :mod:`scheduler.store`) and
:func:`wait_for_run` lets the CLI wait for the ledger entry it produces.
``next`` lists fires with the very triggers the scheduler runs on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from apscheduler.triggers.base import BaseTrigger

from scheduler.crontab import wall_time
from scheduler.jobs import (
    HEARTBEAT_JOB_ID,
    CronJob,
    JobNotFoundError,
    RunRecord,
    SchedulerNotRunningError,
    build_job,
    make_target,
)
from scheduler.schedules import (
    Clock,
    EverySchedule,
    Schedule,
    ScheduleError,
    build_schedule,
    iso_utc,
    next_fire,
    parse_at,
    timezone_option,
    utc_now,
)
from scheduler.store import JobStore

MAX_NEXT_COUNT = 1000


@dataclass(frozen=True)
class CronAddOptions:
    """``botd cron add`` options (exactly one of at / in_ / every / cron)."""

    prompt: str
    channel: str
    chat_id: str
    thread_id: str | None = None
    at: str | None = None
    in_: str | None = None
    every: str | None = None
    cron: str | None = None
    tz: str | None = None
    allow: str | Sequence[str] | None = None
    job_id: str | None = None
    created_by: str = "cli"


async def cron_add(
    store: JobStore, options: CronAddOptions, *, default_timezone: str = "UTC", clock: Clock = utc_now
) -> str:
    """Create the job and return its id (CronError on bad input or a taken id)."""
    job = build_job(
        prompt=options.prompt,
        target=make_target(options.channel, options.chat_id, options.thread_id),
        at=options.at,
        in_=options.in_,
        every=options.every,
        cron=options.cron,
        tz=options.tz,
        allow=options.allow,
        job_id=options.job_id,
        created_by=options.created_by,
        default_tz=default_timezone,
        now=clock(),
    )
    await store.add(job)
    return job.id


def job_row(job: CronJob, now: datetime) -> dict[str, Any]:
    """One job as plain JSON-ready data (what ``cron list --json`` prints)."""
    upcoming = job.next_run_at(now)
    last = job.last_run
    return {
        "id": job.id,
        "enabled": job.enabled,
        "schedule": job.schedule.describe(),
        "schedule_spec": job.schedule.model_dump(mode="json"),
        "next_run": iso_utc(upcoming) if upcoming else None,
        "target": job.target.model_dump(mode="json"),
        "allow": list(job.allow),
        "prompt": job.prompt,
        "created_by": job.created_by,
        "created_in": job.created_in.model_dump(mode="json") if job.created_in else None,
        "created_at": iso_utc(job.created_at),
        "failure_streak": job.failure_streak,
        "disabled_reason": job.disabled_reason,
        "last_run": last.model_dump(mode="json") if last else None,
    }


async def cron_list(store: JobStore, *, clock: Clock = utc_now) -> list[dict[str, Any]]:
    """Every job as a row, oldest first."""
    now = clock()
    return [job_row(job, now) for job in await store.list()]


async def cron_list_json(store: JobStore, *, clock: Clock = utc_now) -> str:
    return json.dumps(await cron_list(store, clock=clock), indent=2, ensure_ascii=False)


def format_job_table(rows: Sequence[dict[str, Any]]) -> str:
    """A fixed-width table for humans; times in UTC."""
    if not rows:
        return "No cron jobs."
    header = ("ID", "STATE", "SCHEDULE", "NEXT RUN (UTC)", "LAST", "TARGET", "PROMPT")
    lines = [header]
    for row in rows:
        target = row["target"]
        where = f"{target['channel']}:{target['chat_id']}" + (
            f"/{target['thread_id']}" if target["thread_id"] else ""
        )
        last = row["last_run"]["run_status"] if row["last_run"] else "-"
        if row["failure_streak"]:
            last += f" ({row['failure_streak']} failed)"
        prompt = " ".join(row["prompt"].split())
        lines.append(
            (
                row["id"],
                "enabled" if row["enabled"] else "disabled",
                row["schedule"],
                (row["next_run"] or "-").replace("T", " ").removesuffix("Z"),
                last,
                where,
                prompt if len(prompt) <= 40 else prompt[:39] + "…",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


async def cron_remove(store: JobStore, job_id: str) -> None:
    """Delete a job; JobNotFoundError when there is none."""
    if not await store.remove(job_id):
        raise JobNotFoundError(job_id)


async def cron_run_now(store: JobStore, job_id: str, *, clock: Clock = utc_now) -> str:
    """Ask a running daemon to run ``job_id`` (or ``heartbeat``) now; returns the request id."""
    if job_id != HEARTBEAT_JOB_ID and await store.get(job_id) is None:
        raise JobNotFoundError(job_id)
    if not await store.schedulers_listening():
        # Queued, it would run whenever a daemon next starts (or expire): refuse instead.
        raise SchedulerNotRunningError(
            "no running daemon is listening on this store (start `botd run`); nothing was requested"
        )
    request = await store.request_run_now(job_id, clock())
    return request.request_id


async def wait_for_run(
    store: JobStore, job_id: str, request_id: str, *, timeout_s: float = 660.0, poll_s: float = 0.5
) -> RunRecord | None:
    """The ledger entry of a run-now request once it is there; None after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        for record in await store.ledger.recent(job_id, limit=20):
            if record.request_id == request_id:
                return record
        if loop.time() >= deadline:
            return None
        await asyncio.sleep(poll_s)


def run_verdict(record: RunRecord) -> str | None:
    """Why a finished run-now counts as a failure (for a non-zero exit), or None when it did not fail.

    A skipped run (nothing to do, or one already in progress) decided not to run: not a failure.
    """
    if record.failed:
        return f"run {record.run_status}: {record.error or 'no reason given'}"
    if record.delivery_status == "failed":
        return f"run ok but its delivery failed: {record.error or 'no reason given'}"
    return None


@dataclass(frozen=True)
class NextQuery:
    """``botd cron next`` options: a stored job id or exactly one inline schedule."""

    job_id: str | None = None
    cron: str | None = None
    every: str | None = None
    at: str | None = None
    tz: str | None = None
    after: str | None = None
    count: int = 5


@dataclass(frozen=True)
class UpcomingFires:
    """Fire instants and the zone to show them in."""

    fires: tuple[datetime, ...]
    zone: ZoneInfo

    def render(self, as_json: bool = False) -> str:
        """One ISO 8601 instant a line (nothing when there are none), or a JSON list; newline-ended."""
        shown = [fire.astimezone(self.zone).isoformat() for fire in self.fires]
        return json.dumps(shown) + "\n" if as_json else "".join(f"{line}\n" for line in shown)


def upcoming_fires(trigger: BaseTrigger, after: datetime, count: int) -> tuple[datetime, ...]:
    """The first ``count`` fires at or after ``after``, chained exactly as APScheduler chains them."""
    fires: list[datetime] = []
    try:
        fire = next_fire(trigger, after)
        while fire is not None and len(fires) < count:
            fires.append(fire)
            following: datetime | None = trigger.get_next_fire_time(fire, fire)
            if following is None or following <= fire:
                break
            fire = following
    except (OverflowError, ValueError):
        pass  # the next fire would lie beyond year 9999: there is none
    return tuple(fires)


def inline_next(query: NextQuery, *, default_timezone: str = "UTC", clock: Clock = utc_now) -> UpcomingFires:
    """Fires of a schedule given on the command line (no store needed)."""
    given = [name for name, value in (("cron", query.cron), ("every", query.every), ("at", query.at)) if value]
    if query.job_id is not None or len(given) != 1:
        raise ScheduleError("give exactly one of: a job id, --cron, --every or --at")
    zone_name = timezone_option(query.tz, default_timezone)
    after = _after(query.after, zone_name, clock)
    schedule: Schedule
    if query.at:
        # Any time is a valid question here; one in the past just has no fires after --after.
        schedule = parse_at(query.at, tz=zone_name, now=datetime.min.replace(tzinfo=UTC))
    else:
        # An interval is anchored where a job made at --after would be.
        schedule = build_schedule(
            cron=query.cron, every=query.every, tz=query.tz, default_tz=default_timezone, now=after
        )
    return UpcomingFires(upcoming_fires(schedule.trigger(), after, _count(query)), _zone_of(schedule))


async def job_next(
    store: JobStore, query: NextQuery, *, default_timezone: str = "UTC", clock: Clock = utc_now
) -> UpcomingFires:
    """Fires of a stored job as its scheduler sees them: back-off included, none when disabled."""
    if query.job_id is None or query.cron or query.every or query.at:
        raise ScheduleError("give exactly one of: a job id, --cron, --every or --at")
    job = await store.get(query.job_id)
    if job is None:
        raise JobNotFoundError(query.job_id)
    zone = _zone_of(job.schedule)
    after = _after(query.after, timezone_option(query.tz, zone.key), clock)
    fires = upcoming_fires(job.trigger(), after, _count(query)) if job.enabled else ()
    return UpcomingFires(fires, zone)


def _zone_of(schedule: Schedule) -> ZoneInfo:
    return ZoneInfo("UTC" if isinstance(schedule, EverySchedule) else schedule.tz)


def _count(query: NextQuery) -> int:
    if not 1 <= query.count <= MAX_NEXT_COUNT:
        raise ScheduleError(f"count: must be 1-{MAX_NEXT_COUNT}, got {query.count}")
    return query.count


def _after(text: str | None, zone_name: str, clock: Clock) -> datetime:
    """--after as an instant: ISO 8601; without an offset it is read in ``zone_name``."""
    if not text:
        return clock()
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ScheduleError(f"after: {text!r} is not an ISO-8601 time (e.g. 2027-03-28T09:00:00+02:00)") from None
    try:
        instant = moment.astimezone(UTC) if moment.tzinfo is not None else wall_time(moment, ZoneInfo(zone_name)).first
    except OverflowError:
        instant = datetime.min.replace(tzinfo=UTC)
    if not 2 <= instant.year <= 9998:
        raise ScheduleError(f"after: {text!r} is outside the years 2-9998")
    return instant
