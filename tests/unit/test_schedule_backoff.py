"""Back-off ladder, auto-disable after 10 failures (one notice), one-shot lifecycle."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import redis.asyncio as aioredis

from bot.store.keys import Keys
from scheduler.fires import CronFires
from scheduler.jobs import (
    BACKOFF_LADDER_S,
    MAX_CONSECUTIVE_FAILURES,
    CronJob,
    FireTrigger,
    RunRecord,
    apply_run,
    backoff_s,
)
from scheduler.ports import JobTarget, ScheduledRunStatus
from scheduler.schedules import parse_every, parse_in
from scheduler.store import FireClaims, JobStore
from tests.unit.test_schedule_fakes import RecordingRunner

NOW = datetime(2027, 5, 3, 8, 0, tzinfo=UTC)
TARGET = JobTarget(channel="slack", chat_id="C42", thread_id="1700000000.000100")


def recurring(**fields: object) -> CronJob:
    values: dict[str, object] = {
        "id": "report",
        "schedule": parse_every("1m", now=NOW),
        "prompt": "post the report",
        "target": TARGET,
        "created_at": NOW,
    }
    values.update(fields)
    return CronJob.model_validate(values)


def one_shot(**fields: object) -> CronJob:
    return recurring(id="remind", schedule=parse_in("10m", tz="UTC", now=NOW), **fields)


def record(status: ScheduledRunStatus, *, at: datetime = NOW, trigger: FireTrigger = "schedule") -> RunRecord:
    return RunRecord(
        job_id="x",
        run_id="r",
        fire_time=at,
        trigger=trigger,
        started_at=at,
        finished_at=at,
        run_status=status,
        delivery_status="failed" if status == "ok" else "unknown",
        error=None if status == "ok" else "boom",
    )


def test_ladder() -> None:
    assert BACKOFF_LADDER_S == (30, 60, 300, 900, 3600)
    assert [backoff_s(n) for n in range(1, 8)] == [30, 60, 300, 900, 3600, 3600, 3600]
    assert backoff_s(0) == 0


def test_failures_push_the_next_run_back_and_success_resets() -> None:
    job = recurring()
    delays = []
    for n in range(1, 6):
        finished = NOW + timedelta(hours=n)
        job = apply_run(job, record("error" if n % 2 else "timeout", at=finished)).job
        assert job.failure_streak == n
        assert job.not_before is not None
        delays.append((job.not_before - finished).total_seconds())
        # The next fire respects the floor.
        upcoming = job.next_run_at(finished)
        assert upcoming is not None and upcoming >= job.not_before
    assert delays == [30, 60, 300, 900, 3600]
    ok = apply_run(job, record("ok", at=NOW + timedelta(hours=9)))
    assert (ok.job.failure_streak, ok.job.not_before, ok.remove, ok.disabled_now) == (0, None, False, False)


def test_delivery_failure_is_not_a_run_failure() -> None:
    after = apply_run(recurring(failure_streak=3), record("ok"))
    assert after.job.failure_streak == 0
    assert after.job.last_run is not None and after.job.last_run.delivery_status == "failed"


def test_tenth_failure_disables_once() -> None:
    job = recurring(failure_streak=MAX_CONSECUTIVE_FAILURES - 2)
    ninth = apply_run(job, record("error"))
    assert ninth.job.enabled and not ninth.disabled_now
    tenth = apply_run(ninth.job, record("error"))
    assert not tenth.job.enabled and tenth.disabled_now
    assert tenth.job.disabled_reason == "disabled after 10 failed runs in a row"
    eleventh = apply_run(tenth.job, record("error", trigger="run_now"))
    assert not eleventh.disabled_now and eleventh.job.failure_streak == 11


def test_skipped_run_leaves_the_streak_alone() -> None:
    after = apply_run(recurring(failure_streak=2), record("skipped"))
    assert after.job.failure_streak == 2 and after.job.enabled and not after.remove


def test_one_shot_lifecycle() -> None:
    assert apply_run(one_shot(), record("ok")).remove
    due = NOW + timedelta(minutes=10)
    failed = apply_run(one_shot(), record("error", at=due))
    assert not failed.remove and failed.job.enabled
    assert failed.job.not_before == due + timedelta(seconds=30)
    # The retry is a fire at the back-off time.
    assert failed.job.next_run_at(due) == due + timedelta(seconds=30)
    skipped = apply_run(one_shot(), record("skipped"))
    assert not skipped.remove and not skipped.job.enabled and "skipped" in (skipped.job.disabled_reason or "")
    # A manual run does not consume the one-shot.
    assert not apply_run(one_shot(), record("ok", trigger="run_now")).remove


def test_successful_run_now_re_enables_a_job_disabled_by_failures() -> None:
    disabled = apply_run(recurring(failure_streak=9), record("error")).job
    assert not disabled.enabled
    assert not apply_run(disabled, record("ok")).job.enabled  # only a manual run revives it
    revived = apply_run(disabled, record("ok", trigger="run_now")).job
    assert revived.enabled and revived.disabled_reason is None and revived.failure_streak == 0


async def test_ten_failures_in_a_row_notify_the_chat_exactly_once(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))
    clock_now = [NOW]
    runner = RecordingRunner(status="error", error="the model is unreachable")
    fires = CronFires(
        store,
        FireClaims(redis_client, Keys(redis_prefix)),
        runner,
        agent_id="main",
        session_key_for_job=lambda job_id: f"agent:main:cron:{job_id}",
        run_timeout_s=600,
        clock=lambda: clock_now[0],
        owner="t",
    )
    await store.add(recurring())
    for attempt in range(12):
        job = await store.get("report")
        assert job is not None
        fire_at = job.next_run_at(clock_now[0]) if job.enabled else clock_now[0] + timedelta(minutes=1)
        assert fire_at is not None
        clock_now[0] = fire_at
        result = await fires.fire("report", fire_at)
        if attempt < MAX_CONSECUTIVE_FAILURES:
            assert result is not None and result.run_status == "error"
        else:
            assert result is None  # disabled jobs do not run
    job = await store.get("report")
    assert job is not None and not job.enabled and job.failure_streak == MAX_CONSECUTIVE_FAILURES
    assert len(runner.requests) == MAX_CONSECUTIVE_FAILURES
    assert len(runner.notices) == 1
    target, text = runner.notices[0]
    assert target == TARGET
    assert "'report'" in text and "10 failed runs" in text and "the model is unreachable" in text
    ledger = await store.ledger.recent("report")
    assert len(ledger) == MAX_CONSECUTIVE_FAILURES and all(r.run_status == "error" for r in ledger)
    # A manual run that fails again does not notify again.
    await fires.run_now("report")
    assert len(runner.notices) == 1


async def test_fire_before_the_back_off_floor_is_not_run(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))
    runner = RecordingRunner()
    fires = CronFires(
        store,
        FireClaims(redis_client, Keys(redis_prefix)),
        runner,
        agent_id="main",
        session_key_for_job=lambda job_id: job_id,
        run_timeout_s=600,
        clock=lambda: NOW,
        owner="t",
    )
    await store.add(recurring(failure_streak=3, not_before=NOW + timedelta(minutes=5)))
    assert await fires.fire("report", NOW + timedelta(minutes=1)) is None
    assert runner.requests == []
    assert await fires.fire("report", NOW + timedelta(minutes=5)) is not None


async def test_overlapping_runs_are_skipped(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))
    claims = FireClaims(redis_client, Keys(redis_prefix))
    runner = RecordingRunner()
    fires = CronFires(
        store,
        claims,
        runner,
        agent_id="main",
        session_key_for_job=lambda job_id: job_id,
        run_timeout_s=600,
        clock=lambda: NOW,
        owner="t",
    )
    await store.add(recurring())
    token = await claims.acquire_running("report", 60)
    assert token is not None
    skipped = await fires.fire("report", NOW + timedelta(minutes=1))
    assert (
        skipped is not None
        and skipped.run_status == "skipped"
        and "still in progress" in (skipped.error or "")
    )
    await claims.release_running("report", token)
    ran = await fires.fire("report", NOW + timedelta(minutes=2))
    assert ran is not None and ran.run_status == "ok"
    assert len(runner.requests) == 1
