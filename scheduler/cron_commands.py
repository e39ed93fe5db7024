"""What ``botd cron add|list|rm|run-now`` do, minus the argument parsing and printing.

The daemon's CLI parses options, builds a :class:`~scheduler.store.JobStore` on
the configured Redis and calls these; every failure is a
:class:`~scheduler.schedules.CronError` whose message is ready to print. Changes
reach running daemons through the store's change channel; ``run-now`` goes
through the run-now queue (see :mod:`scheduler.store`) and
:func:`wait_for_run` lets the CLI wait for the ledger entry it produces.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from scheduler.jobs import HEARTBEAT_JOB_ID, CronJob, JobNotFoundError, RunRecord, build_job, make_target
from scheduler.schedules import Clock, iso_utc, utc_now
from scheduler.store import JobStore


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
