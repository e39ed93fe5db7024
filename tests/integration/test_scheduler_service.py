"""Two SchedulerService replicas in one process sharing a real Redis, with recording runners."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis.asyncio as aioredis

from agent.types import RunRequest
from bot.gateway.signals import Broadcast
from bot.store.keys import Keys
from scheduler.cron_commands import CronAddOptions, cron_add, cron_run_now, wait_for_run
from scheduler.cron_tool import CronTool
from scheduler.jobs import CronJob, apply_run
from scheduler.ports import JobTarget
from scheduler.schedules import AtSchedule, EverySchedule, utc_now
from scheduler.service import SchedulerService
from scheduler.settings import HeartbeatSettings, SchedulerSettings
from scheduler.store import FireClaims, JobStore
from tests.unit.test_schedule_fakes import RecordingRunner, wait_until

TARGET = JobTarget(channel="telegram", chat_id="-1009")
Factory = Callable[..., Awaitable[tuple[SchedulerService, RecordingRunner]]]


@pytest.fixture
async def replicas(redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path) -> AsyncIterator[Factory]:
    """Start replicas on demand; every one is stopped at the end."""
    started: list[SchedulerService] = []
    listeners: list[Broadcast] = []

    async def start(
        *,
        catch_up: str = "once",
        heartbeat: HeartbeatSettings | None = None,
        resync_s: float = 3600.0,
        runner: RecordingRunner | None = None,
        misfire_grace_s: float = 60.0,
    ) -> tuple[SchedulerService, RecordingRunner]:
        runner = runner or RecordingRunner()
        signals = Broadcast(redis_client)
        service = SchedulerService(
            redis_client,
            Keys(redis_prefix),
            runner,
            signals=signals,
            heartbeat=heartbeat or HeartbeatSettings(),
            settings=SchedulerSettings(  # type: ignore[arg-type]
                catch_up=catch_up, resync_interval_s=resync_s, misfire_grace_s=misfire_grace_s
            ),
            workspace=tmp_path,
            session_key_for_job=lambda job_id: f"agent:main:cron:{job_id}",
            heartbeat_session_key="agent:main:heartbeat",
            instance_id=f"replica-{len(started)}",
        )
        listeners.append(signals)
        await signals.start()
        await service.start()
        started.append(service)
        return service, runner

    yield start
    for service in started:
        await service.stop(grace_s=1.0)
    for signals in listeners:
        await signals.close()


def all_requests(*runners: RecordingRunner) -> list[RunRequest]:
    return [request for runner in runners for request in runner.requests]


def stored_job(job_id: str, *, schedule: Any, created_at: datetime, **fields: Any) -> CronJob:
    return CronJob(
        id=job_id, schedule=schedule, prompt="do the thing", target=TARGET, created_at=created_at, **fields
    )


async def test_one_fire_runs_once_across_replicas(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    a, runner_a = await replicas()
    b, runner_b = await replicas()
    store = JobStore(redis_client, Keys(redis_prefix))
    job_id = await cron_add(
        store, CronAddOptions(prompt="ping", channel="telegram", chat_id="-1009", in_="1s")
    )
    assert await wait_until(
        lambda: a.next_fire_time(job_id) is not None and b.next_fire_time(job_id) is not None, 2
    )
    assert a.next_fire_time(job_id) == b.next_fire_time(job_id)
    assert await wait_until(lambda: len(all_requests(runner_a, runner_b)) >= 1, 5)
    # Give the losing replica ample time to (wrongly) run it too.
    assert not await wait_until(lambda: len(all_requests(runner_a, runner_b)) > 1, 1.5)
    [request] = all_requests(runner_a, runner_b)
    assert (request.kind, request.channel, request.chat_id) == ("cron", "telegram", "-1009")
    assert request.session_key == f"agent:main:cron:{job_id}" and request.meta["fresh_session"] == "1"
    # The one-shot is gone after its successful run; its ledger remains.
    assert await wait_until(lambda: a.next_fire_time(job_id) is None and b.next_fire_time(job_id) is None, 2)
    assert await store.get(job_id) is None
    [entry] = await store.ledger.recent(job_id)
    assert (entry.run_status, entry.delivery_status, entry.trigger, entry.run_id) == (
        "ok",
        "delivered",
        "schedule",
        request.run_id,
    )
    assert entry.finished_at >= entry.started_at


async def test_a_job_added_elsewhere_is_scheduled_by_every_replica(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    a, _ = await replicas()
    b, _ = await replicas()
    store = JobStore(redis_client, Keys(redis_prefix))  # like the CLI: no scheduler of its own
    job_id = await cron_add(
        store, CronAddOptions(prompt="p", channel="slack", chat_id="C1", cron="0 9 * * 0", tz="Europe/Berlin")
    )
    assert await wait_until(
        lambda: a.next_fire_time(job_id) is not None and b.next_fire_time(job_id) is not None, 2
    )
    upcoming = a.next_fire_time(job_id)
    assert upcoming is not None and upcoming.astimezone(ZoneInfo("Europe/Berlin")).strftime("%a %H:%M") == "Sun 09:00"
    await store.update(job_id, lambda j: j.model_copy(update={"enabled": False}))
    assert await wait_until(lambda: a.next_fire_time(job_id) is None and b.next_fire_time(job_id) is None, 2)
    await store.update(job_id, lambda j: j.model_copy(update={"enabled": True}))
    assert await wait_until(lambda: b.next_fire_time(job_id) is not None, 2)
    await store.remove(job_id)
    assert await wait_until(lambda: a.scheduled_job_ids() == [] and b.scheduled_job_ids() == [], 2)


async def test_a_job_created_on_one_replica_fires_on_the_other(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    # Replica A makes the job (through its own store) but is stopped before it is due.
    a, runner_a = await replicas()
    b, runner_b = await replicas()
    job_id = await cron_add(a.store, CronAddOptions(prompt="p", channel="telegram", chat_id="1", in_="1s"))
    assert await wait_until(lambda: b.next_fire_time(job_id) is not None, 2)
    await a.stop()
    assert await wait_until(lambda: len(runner_b.requests) == 1, 5)
    assert runner_a.requests == []


async def test_resync_repairs_a_lost_change_message(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    a, _ = await replicas()
    store = JobStore(redis_client, Keys(redis_prefix))
    job = stored_job("quiet", schedule=EverySchedule(every_s=3600, anchor=utc_now()), created_at=utc_now())
    await redis_client.set(store.job_key(job.id), job.model_dump_json())  # written without a notification
    await redis_client.sadd(store.index_key, job.id)
    assert a.next_fire_time("quiet") is None
    await a.resync()
    assert a.next_fire_time("quiet") is not None
    await redis_client.delete(store.job_key(job.id))
    await redis_client.srem(store.index_key, job.id)
    await a.resync()
    assert a.next_fire_time("quiet") is None


async def test_periodic_resync_picks_up_jobs(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    a, _ = await replicas(resync_s=0.2)
    store = JobStore(redis_client, Keys(redis_prefix))
    job = stored_job("silent", schedule=EverySchedule(every_s=3600, anchor=utc_now()), created_at=utc_now())
    await redis_client.set(store.job_key(job.id), job.model_dump_json())
    await redis_client.sadd(store.index_key, job.id)
    assert await wait_until(lambda: a.next_fire_time("silent") is not None, 3)


async def test_missed_runs_catch_up_once(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    now = utc_now().replace(microsecond=0)
    created = now - timedelta(hours=5, minutes=10)
    store = JobStore(redis_client, Keys(redis_prefix))
    await store.add(
        stored_job("hourly", schedule=EverySchedule(every_s=3600, anchor=created), created_at=created)
    )
    # "Downtime": five fires (created+1h … +5h) passed while no replica ran.
    a, runner_a = await replicas()
    _, runner_b = await replicas()
    assert await wait_until(lambda: len(all_requests(runner_a, runner_b)) >= 1, 5)
    assert not await wait_until(lambda: len(all_requests(runner_a, runner_b)) > 1, 1.0)
    [entry] = await store.ledger.recent("hourly")
    assert entry.trigger == "catch_up" and entry.fire_time == created + timedelta(hours=5)
    # A restart does not catch up again: the last fire is recorded.
    await a.stop()
    _, runner_c = await replicas()
    assert not await wait_until(lambda: len(runner_c.requests) > 0, 1.0)
    assert await FireClaims(redis_client, Keys(redis_prefix)).last_fire("hourly") == created + timedelta(hours=5)


async def test_missed_runs_after_the_last_recorded_fire(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    now = utc_now().replace(microsecond=0)
    created = now - timedelta(days=2, minutes=10)
    store = JobStore(redis_client, Keys(redis_prefix))
    await store.add(
        stored_job("hourly", schedule=EverySchedule(every_s=3600, anchor=created), created_at=created)
    )
    await FireClaims(redis_client, Keys(redis_prefix)).note_fire(
        "hourly", now - timedelta(minutes=10)
    )  # the latest grid time
    _, runner = await replicas()
    assert not await wait_until(lambda: len(runner.requests) > 0, 1.0)  # nothing due since the last fire


async def test_skip_mode_records_instead_of_running(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    now = utc_now().replace(microsecond=0)
    created = now - timedelta(hours=3, minutes=10)
    store = JobStore(redis_client, Keys(redis_prefix))
    await store.add(
        stored_job("hourly", schedule=EverySchedule(every_s=3600, anchor=created), created_at=created)
    )
    await store.add(
        stored_job("reminder", schedule=AtSchedule(at=now - timedelta(hours=1)), created_at=created)
    )
    _, runner_a = await replicas(catch_up="skip")
    _, runner_b = await replicas(catch_up="skip")

    async def ledgers() -> tuple[list[Any], list[Any]]:
        return await store.ledger.recent("hourly"), await store.ledger.recent("reminder")

    for _ in range(100):
        hourly, reminder = await ledgers()
        if hourly and reminder:
            break
        await asyncio.sleep(0.05)
    hourly, reminder = await ledgers()
    assert [(r.run_status, r.trigger) for r in hourly] == [("skipped", "catch_up")]
    assert "scheduler.catch_up: skip" in (hourly[0].error or "")
    assert [r.run_status for r in reminder] == ["skipped"]
    assert all_requests(runner_a, runner_b) == []
    kept = await store.get("reminder")
    assert kept is not None and not kept.enabled  # a skipped one-shot stays visible, disabled
    still = await store.get("hourly")
    assert still is not None and still.enabled


async def test_overdue_one_shot_runs_once_then_is_removed(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    now = utc_now().replace(microsecond=0)
    store = JobStore(redis_client, Keys(redis_prefix))
    await store.add(
        stored_job(
            "late", schedule=AtSchedule(at=now - timedelta(minutes=40)), created_at=now - timedelta(hours=1)
        )
    )
    _, runner_a = await replicas()
    _, runner_b = await replicas()
    assert await wait_until(lambda: len(all_requests(runner_a, runner_b)) == 1, 5)
    for _ in range(100):
        if await store.get("late") is None:
            break
        await asyncio.sleep(0.05)
    assert await store.get("late") is None
    assert len(all_requests(runner_a, runner_b)) == 1


async def test_heartbeat_catches_up_once_after_downtime(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    (tmp_path / "HEARTBEAT.md").write_text("- look at the error dashboard\n", encoding="utf-8")
    await FireClaims(redis_client, Keys(redis_prefix)).note_fire("heartbeat", utc_now() - timedelta(hours=2))
    heartbeat = HeartbeatSettings(enabled=True, every="30m", target=TARGET)
    a, runner_a = await replicas(heartbeat=heartbeat)
    b, runner_b = await replicas(heartbeat=heartbeat)
    assert a.next_fire_time("heartbeat") == b.next_fire_time("heartbeat")
    upcoming = a.next_fire_time("heartbeat")
    assert upcoming is not None and upcoming.minute in (0, 30) and upcoming.second == 0
    assert await wait_until(lambda: len(all_requests(runner_a, runner_b)) >= 1, 5)
    assert not await wait_until(lambda: len(all_requests(runner_a, runner_b)) > 1, 1.0)
    [request] = all_requests(runner_a, runner_b)
    assert (request.kind, request.channel, request.chat_id) == ("heartbeat", "telegram", "-1009")
    assert request.meta["trigger"] == "catch_up"
    assert "look at the error dashboard" in request.text


async def test_first_start_sets_the_heartbeat_baseline_without_a_run(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    (tmp_path / "HEARTBEAT.md").write_text("- task\n", encoding="utf-8")
    _, runner = await replicas(heartbeat=HeartbeatSettings(enabled=True, every="30m", target=TARGET))
    assert await FireClaims(redis_client, Keys(redis_prefix)).last_fire("heartbeat") is not None
    assert not await wait_until(lambda: len(runner.requests) > 0, 0.5)


async def test_run_now_through_redis_reaches_exactly_one_replica(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    (tmp_path / "HEARTBEAT.md").write_text("- check\n", encoding="utf-8")
    heartbeat = HeartbeatSettings(enabled=True, every="1h", target=TARGET)
    _, runner_a = await replicas(heartbeat=heartbeat)
    _, runner_b = await replicas(heartbeat=heartbeat)
    store = JobStore(redis_client, Keys(redis_prefix))
    job_id = await cron_add(store, CronAddOptions(prompt="p", channel="telegram", chat_id="5", every="1d"))
    request_id = await cron_run_now(store, job_id)
    record = await wait_for_run(store, job_id, request_id, timeout_s=5, poll_s=0.05)
    assert record is not None and (record.run_status, record.trigger) == ("ok", "run_now")
    heartbeat_request = await cron_run_now(store, "heartbeat")
    beat = await wait_for_run(store, "heartbeat", heartbeat_request, timeout_s=5, poll_s=0.05)
    assert beat is not None and beat.run_status == "ok"
    assert sorted(r.kind for r in all_requests(runner_a, runner_b)) == ["cron", "heartbeat"]
    # The recurring job is still there and still scheduled.
    assert await store.get(job_id) is not None


async def test_stale_run_now_requests_are_recorded_not_run(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))
    job_id = await cron_add(store, CronAddOptions(prompt="p", channel="telegram", chat_id="5", every="1d"))
    old = await store.request_run_now(job_id, utc_now() - timedelta(hours=3))
    _, runner = await replicas()
    record = await wait_for_run(store, job_id, old.request_id, timeout_s=3, poll_s=0.05)
    assert record is not None and record.run_status == "skipped" and "expired" in (record.error or "")
    assert runner.requests == []


async def test_run_now_in_process_and_backoff_reschedules_everywhere(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    failing = RecordingRunner(status="error", error="model down")
    a, _ = await replicas(runner=failing)
    b, _ = await replicas()
    job_id = await cron_add(a.store, CronAddOptions(prompt="p", channel="telegram", chat_id="5", every="1m"))
    assert await wait_until(lambda: b.next_fire_time(job_id) is not None, 2)
    record = await a.run_now(job_id)
    assert record.run_status == "error" and record.error == "model down"
    job = await a.store.get(job_id)
    # A manual run counts in the streak but never sets a back-off floor.
    assert job is not None and job.failure_streak == 1 and job.not_before is None
    # A failed scheduled fire does, and every replica reschedules after it.
    scheduled = record.model_copy(update={"trigger": "schedule", "request_id": None})
    updated = await a.store.update(job_id, lambda current: apply_run(current, scheduled).job)
    assert updated is not None and updated.not_before is not None
    floor = updated.not_before
    assert await wait_until(
        lambda: all((t := s.next_fire_time(job_id)) is not None and t >= floor for s in (a, b)), 2
    )


async def test_failed_run_now_never_moves_a_one_shot_earlier(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    # A reminder in 20 minutes whose manual run fails (its channel is off) still fires in 20 minutes.
    failing = RecordingRunner(status="error", error="telegram is not enabled")
    a, _ = await replicas(runner=failing)
    b, _ = await replicas()
    job_id = await cron_add(a.store, CronAddOptions(prompt="p", channel="telegram", chat_id="5", in_="20m"))
    job = await a.store.get(job_id)
    assert job is not None and isinstance(job.schedule, AtSchedule)
    due = job.schedule.at
    assert await wait_until(lambda: all(s.next_fire_time(job_id) == due for s in (a, b)), 2)
    record = await a.run_now(job_id)
    assert record.run_status == "error"
    after = await a.store.get(job_id)
    assert after is not None and after.enabled and after.failure_streak == 1
    assert after.next_run_at(utc_now()) == due
    await asyncio.sleep(0.3)  # the change has reached both replicas
    assert all(s.next_fire_time(job_id) == due for s in (a, b))
    assert len(failing.requests) == 1


async def test_cron_tool_from_a_chat_to_a_delivered_run(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    from agent.tools.registry import ToolContext, ToolError, ToolSettings

    a, runner_a = await replicas()
    b, runner_b = await replicas()
    tool = CronTool(a.store)

    def chat(chat_id: str) -> ToolContext:
        return ToolContext(
            run_id="r",
            session_key="s",
            settings=ToolSettings(workspace=Path("/tmp")),
            chat={"channel": "slack", "chat_id": chat_id, "thread_id": "99.1"},
            extra={"user_id": "U1"},
        )

    await tool.execute(
        {"action": "add", "in": "1s", "prompt": "remind about lunch", "id": "lunch"}, chat("C1")
    )
    await tool.execute({"action": "add", "every": "1h", "prompt": "hourly check", "id": "hourly"}, chat("C1"))
    listing = (await tool.execute({"action": "list"}, chat("C1"))).content
    assert "lunch" in listing and "hourly" in listing
    assert (await tool.execute({"action": "list"}, chat("C2"))).content == "No cron jobs for this chat."
    with pytest.raises(ToolError, match="created in slack chat C1"):
        await tool.execute({"action": "remove", "id": "hourly"}, chat("C2"))
    assert await wait_until(lambda: len(all_requests(runner_a, runner_b)) == 1, 5)
    [request] = all_requests(runner_a, runner_b)
    assert (request.channel, request.chat_id, request.thread_id) == ("slack", "C1", "99.1")
    assert "remind about lunch" in request.text
    assert await wait_until(lambda: b.next_fire_time("hourly") is not None, 2)
    await tool.execute({"action": "remove", "id": "hourly"}, chat("C1"))
    assert await wait_until(lambda: a.scheduled_job_ids() == [] and b.scheduled_job_ids() == [], 2)


async def test_stop_lets_a_running_job_finish(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    slow = RecordingRunner(delay_s=0.5)
    a, _ = await replicas(runner=slow)
    job_id = await cron_add(a.store, CronAddOptions(prompt="p", channel="telegram", chat_id="5", in_="1s"))
    assert await wait_until(lambda: len(slow.requests) == 1, 5)
    await a.stop(grace_s=5)
    [entry] = await a.store.ledger.recent(job_id)
    assert entry.run_status == "ok"
    assert not a.running


@pytest.mark.parametrize("catch_up", ["skip", "once"])
async def test_a_fire_delivered_late_follows_catch_up(
    replicas: Factory, redis_client: aioredis.Redis, redis_prefix: str, catch_up: str
) -> None:
    # A host that stalls (suspend, blocked loop) hands APScheduler the fire late.
    a, runner = await replicas(catch_up=catch_up, misfire_grace_s=0.2)
    job_id = await cron_add(a.store, CronAddOptions(prompt="p", channel="telegram", chat_id="5", in_="2s"))
    assert await wait_until(lambda: a.next_fire_time(job_id) is not None, 1.5)
    due = a.next_fire_time(job_id)
    assert due is not None
    await asyncio.sleep(max((due - utc_now()).total_seconds() - 0.2, 0))
    time.sleep(0.8)  # noqa: ASYNC251 - the loop is deliberately stuck across the fire time
    for _ in range(100):
        if await a.store.ledger.recent(job_id):
            break
        await asyncio.sleep(0.05)
    [entry] = await a.store.ledger.recent(job_id)
    if catch_up == "skip":
        assert entry.run_status == "skipped" and "missed by" in (entry.error or "")
        assert runner.requests == []
    else:
        assert entry.run_status == "ok" and len(runner.requests) == 1
