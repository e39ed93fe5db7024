"""What a finished run does to its job: back-off, auto-disable, one-shot removal.

Failures (``error`` or ``timeout``) push the next run back by 30 s, 1 m, 5 m, 15 m,
then 60 m for every further failure, counted from the end of the failed run; a
success resets the streak. The tenth failure in a row disables the job (the
caller tells the target chat, once: only the enabling->disabled transition
reports ``disabled_now``). A failed one-shot job is retried at the back-off time
until it succeeds or is disabled; a successful one-shot is removed; a one-shot
whose only fire was skipped is kept, disabled, so it stays visible in the list.
A manual run-now that succeeds re-enables a job that failures had disabled; one
that fails counts in the streak but sets no back-off floor, so it never moves the
job's own next fire (a one-shot still runs at its time).
Delivery problems never count: only ``run_status`` matters here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from scheduler.jobs import CronJob
from scheduler.ledger import RunRecord

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
