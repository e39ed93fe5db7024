"""Hand one request to the daemon's runner and turn whatever happens into a RunRecord."""

from __future__ import annotations

import asyncio
from datetime import datetime

import structlog

from agent.types import RunRequest
from scheduler.clock import Clock
from scheduler.ledger import FireTrigger, RunRecord, clip_error
from scheduler.ports import DELIVERY_STATUSES, RUN_STATUSES, ScheduledOutcome, ScheduledRunner

log = structlog.get_logger(__name__)

# The runner enforces timeout_s itself; this extra margin only guards against a runner
# that never returns, so a stuck run cannot hold its job forever.
RUNNER_GRACE_S = 30.0


async def run_and_record(
    runner: ScheduledRunner,
    request: RunRequest,
    *,
    job_id: str,
    fire_time: datetime,
    trigger: FireTrigger,
    request_id: str | None,
    timeout_s: float,
    clock: Clock,
) -> RunRecord:
    """Run ``request``; a runner exception becomes ``error``, a hang becomes ``timeout``."""
    started = clock()
    log.info("scheduler.run_started", job_id=job_id, run_id=request.run_id, session_key=request.session_key)
    try:
        outcome = await asyncio.wait_for(
            runner.run_scheduled(request, timeout_s=timeout_s), timeout_s + RUNNER_GRACE_S
        )
    except TimeoutError:
        outcome = ScheduledOutcome(
            run_id=request.run_id,
            run_status="timeout",
            error=f"no result from the runner after {timeout_s + RUNNER_GRACE_S:.0f}s",
        )
    except Exception as exc:
        log.exception("scheduler.runner_failed", job_id=job_id, run_id=request.run_id)
        outcome = ScheduledOutcome(
            run_id=request.run_id, run_status="error", error=f"{type(exc).__name__}: {exc}"
        )
    run_status, delivery, error = outcome.run_status, outcome.delivery_status, outcome.error
    if run_status not in RUN_STATUSES:
        run_status, error = "error", f"runner reported an unknown run status {run_status!r}"
    if delivery not in DELIVERY_STATUSES:
        delivery = "unknown"
    record = RunRecord(
        job_id=job_id,
        run_id=outcome.run_id or request.run_id,
        fire_time=fire_time,
        trigger=trigger,
        request_id=request_id,
        started_at=started,
        finished_at=clock(),
        run_status=run_status,
        delivery_status=delivery,
        error=clip_error(error),
    )
    log.info(
        "scheduler.run_finished",
        job_id=job_id,
        run_id=record.run_id,
        run_status=record.run_status,
        delivery_status=record.delivery_status,
    )
    return record
