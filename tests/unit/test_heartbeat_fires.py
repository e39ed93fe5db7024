"""HeartbeatFires against real Redis: skip rules, deferral, the request it builds, one claim."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from agent.tools.registry import ToolSettings
from bot.store.keys import Keys
from bot.store.owned import OwnedKeys
from bot.workspaces import SessionWorkspaces
from scheduler.fires import DEFAULT_HEARTBEAT_PROMPT
from scheduler.heartbeat import HeartbeatFires
from scheduler.ports import JobTarget
from scheduler.settings import HeartbeatSettings
from scheduler.store import FireClaims, RunLedger
from tests.unit.test_schedule_fakes import RecordingRunner

TARGET = JobTarget(channel="telegram", chat_id="-1001", thread_id="7")
NOON = datetime(2027, 1, 15, 12, 0, tzinfo=UTC)


class ManualClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def make(
    redis_client: aioredis.Redis,
    prefix: str,
    workspace: Path,
    runner: RecordingRunner,
    clock: ManualClock,
    sleeps: list[float] | None = None,
    **overrides: Any,
) -> HeartbeatFires:
    values: dict[str, Any] = {"enabled": True, "every": "30m", "target": TARGET, "busy_retry_s": 30.0}
    values.update(overrides)
    settings = HeartbeatSettings(**values)

    async def fake_sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)
        clock.now += timedelta(seconds=seconds)

    return HeartbeatFires(
        settings,
        FireClaims(redis_client, Keys(prefix), OwnedKeys(redis_client)),
        RunLedger(redis_client, Keys(prefix)),
        runner,
        workspace=workspace,
        agent_id="main",
        session_key="agent:main:heartbeat",
        busy_keys=("agent:main:telegram:group:-1001:topic:7",),
        clock=clock,
        owner="test",
        sleep=fake_sleep,
    )


def write_checklist(workspace: Path, text: str = "# Tasks\n- check the build status\n") -> None:
    (workspace / "HEARTBEAT.md").write_text(text, encoding="utf-8")


async def test_empty_checklist_skips_without_a_run(
    redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    runner = RecordingRunner()
    hb = make(redis_client, redis_prefix, tmp_path, runner, ManualClock(NOON))
    record = await hb.fire(NOON)
    assert record is not None and record.run_status == "skipped"
    assert "HEARTBEAT.md is empty" in (record.error or "")
    write_checklist(tmp_path, "# Heartbeat\n<!-- nothing yet -->\n- [ ]\n")
    second = await hb.fire(NOON + timedelta(minutes=30))
    assert second is not None and second.run_status == "skipped"
    assert runner.requests == [] and runner.busy_checks == []
    ledger = await RunLedger(redis_client, Keys(redis_prefix)).recent("heartbeat")
    assert [r.run_status for r in ledger] == ["skipped", "skipped"]


async def test_run_request_goes_to_the_target_with_the_checklist(
    redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    write_checklist(tmp_path)
    runner = RecordingRunner(delivery="silent")
    hb = make(redis_client, redis_prefix, tmp_path, runner, ManualClock(NOON))
    record = await hb.fire(NOON)
    assert record is not None
    assert (record.run_status, record.delivery_status, record.trigger) == ("ok", "silent", "schedule")
    [request] = runner.requests
    assert (request.channel, request.chat_id, request.thread_id) == ("telegram", "-1001", "7")
    assert (request.kind, request.prompt_mode, request.session_key) == (
        "heartbeat",
        "minimal",
        "agent:main:heartbeat",
    )
    assert request.tool_policy.context == "scheduled" and request.tool_policy.allow == ()
    assert request.text.startswith(DEFAULT_HEARTBEAT_PROMPT)
    assert "- check the build status" in request.text
    assert request.meta["fire_time"] == "2027-01-15T12:00:00Z"
    assert request.dedupe_key == "heartbeat:2027-01-15T12:00:00Z"
    assert runner.timeouts == [600.0]
    assert record.run_id == request.run_id


async def test_custom_prompt_is_used(redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path) -> None:
    write_checklist(tmp_path)
    runner = RecordingRunner()
    hb = make(
        redis_client,
        redis_prefix,
        tmp_path,
        runner,
        ManualClock(NOON),
        prompt="Look around. Say HEARTBEAT_OK if calm.",
    )
    await hb.fire(NOON)
    assert runner.requests[0].text.startswith("Look around. Say HEARTBEAT_OK if calm.\n\nHEARTBEAT.md:\n")


async def test_outside_active_hours_does_nothing(
    redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    write_checklist(tmp_path)
    runner = RecordingRunner()
    hb = make(redis_client, redis_prefix, tmp_path, runner, ManualClock(NOON), active_hours="22:00-06:00")
    assert await hb.fire(NOON) is None
    assert await hb.fire(NOON.replace(hour=23)) is not None
    assert len(runner.requests) == 1
    assert len(await RunLedger(redis_client, Keys(redis_prefix)).recent("heartbeat")) == 1


async def test_catch_up_also_needs_the_present_inside_active_hours(
    redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    write_checklist(tmp_path)
    runner = RecordingRunner()
    clock = ManualClock(NOON.replace(hour=23))  # now is outside 09-22
    hb = make(redis_client, redis_prefix, tmp_path, runner, clock, active_hours="09:00-22:00")
    assert await hb.fire(NOON.replace(hour=21, minute=30), trigger="catch_up") is None
    clock.now = NOON.replace(hour=21, minute=45)
    assert await hb.fire(NOON.replace(hour=21), trigger="catch_up") is not None
    assert len(runner.requests) == 1


async def test_busy_session_defers_then_runs(
    redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    write_checklist(tmp_path)
    answers = iter([True, True])
    runner = RecordingRunner(busy=lambda key: key.endswith("topic:7") and next(answers, False))
    sleeps: list[float] = []
    hb = make(redis_client, redis_prefix, tmp_path, runner, ManualClock(NOON), sleeps)
    record = await hb.fire(NOON)
    assert record is not None and record.run_status == "ok"
    assert sleeps == [30.0, 30.0]
    assert len(runner.requests) == 1
    assert "agent:main:heartbeat" in runner.busy_checks


async def test_busy_session_gives_up_after_the_bounded_retries(
    redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    write_checklist(tmp_path)
    runner = RecordingRunner(busy=lambda key: True)
    sleeps: list[float] = []
    hb = make(redis_client, redis_prefix, tmp_path, runner, ManualClock(NOON), sleeps, busy_max_retries=3)
    record = await hb.fire(NOON)
    assert record is not None and record.run_status == "skipped" and "busy" in (record.error or "")
    assert sleeps == [30.0, 30.0, 30.0]
    assert runner.requests == []


async def test_busy_deferral_never_passes_the_next_fire(
    redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    write_checklist(tmp_path)
    runner = RecordingRunner(busy=lambda key: True)
    sleeps: list[float] = []
    hb = make(
        redis_client,
        redis_prefix,
        tmp_path,
        runner,
        ManualClock(NOON),
        sleeps,
        every="5m",
        busy_retry_s=120.0,
    )
    record = await hb.fire(NOON)
    assert record is not None and record.run_status == "skipped"
    assert sleeps == [120.0, 120.0]  # a third wait would end at 12:06, past the next fire (12:05)


async def test_a_broken_busy_check_does_not_silence_the_heartbeat(
    redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    write_checklist(tmp_path)

    def explode(key: str) -> bool:
        raise RuntimeError("store unavailable")

    runner = RecordingRunner(busy=explode)
    hb = make(redis_client, redis_prefix, tmp_path, runner, ManualClock(NOON))
    record = await hb.fire(NOON)
    assert record is not None and record.run_status == "ok"


async def test_each_fire_is_claimed_once(
    redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    write_checklist(tmp_path)
    first, second = RecordingRunner(), RecordingRunner()
    a = make(redis_client, redis_prefix, tmp_path, first, ManualClock(NOON))
    b = make(redis_client, redis_prefix, tmp_path, second, ManualClock(NOON))
    results = [await a.fire(NOON), await b.fire(NOON)]
    assert sum(r is not None for r in results) == 1
    assert len(first.requests) + len(second.requests) == 1
    assert await FireClaims(redis_client, Keys(redis_prefix), OwnedKeys(redis_client)).last_fire("heartbeat") == NOON
    ttl = await redis_client.ttl(f"{redis_prefix}:fire:heartbeat:2027-01-15T12:00:00Z")
    assert 0 < ttl <= 7 * 86400


async def test_run_now_ignores_active_hours_and_reports_disabled(
    redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    write_checklist(tmp_path)
    runner = RecordingRunner()
    hb = make(redis_client, redis_prefix, tmp_path, runner, ManualClock(NOON), active_hours="22:00-06:00")
    record = await hb.run_now(request_id="r1")
    assert (record.run_status, record.trigger, record.request_id) == ("ok", "run_now", "r1")
    assert runner.requests[0].dedupe_key is None
    off = make(redis_client, redis_prefix, tmp_path, runner, ManualClock(NOON), enabled=False, target=None)
    skipped = await off.run_now()
    assert skipped.run_status == "skipped" and "disabled" in (skipped.error or "")
    assert len(runner.requests) == 1


@pytest.mark.parametrize("failure", ["status", "exception"])
async def test_runner_failures_are_recorded(
    redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path, failure: str
) -> None:
    write_checklist(tmp_path)
    runner = (
        RecordingRunner(status="error", error="model unavailable")
        if failure == "status"
        else RecordingRunner(raise_error=ConnectionError("gateway down"))
    )
    hb = make(redis_client, redis_prefix, tmp_path, runner, ManualClock(NOON))
    record = await hb.fire(NOON)
    assert record is not None and record.run_status == "error"
    assert record.error in ("model unavailable", "ConnectionError: gateway down")


async def test_the_target_chats_own_checklist_comes_before_the_roots(
    redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    write_checklist(root, "- the root's item\n")
    workspaces = SessionWorkspaces(ToolSettings(workspace=root), "user")
    runner = RecordingRunner()
    hb = HeartbeatFires(
        HeartbeatSettings(enabled=True, every="30m", target=TARGET), FireClaims(redis_client, Keys(redis_prefix), OwnedKeys(redis_client)), RunLedger(redis_client, Keys(redis_prefix)),
        runner, workspace=root, checklist_dirs=lambda: workspaces.lookup_dirs("telegram", "-1001"),
        agent_id="main", session_key="agent:main:heartbeat", clock=ManualClock(NOON), owner="test",
    )
    await hb.fire(NOON)
    assert "- the root's item" in runner.requests[-1].text  # no chat directory yet: the root's

    chat_dir = root / "chats" / "telegram--1001"
    chat_dir.mkdir(parents=True)
    write_checklist(chat_dir, "- the chat's own item\n")
    await hb.fire(NOON + timedelta(minutes=30))
    assert "- the chat's own item" in runner.requests[-1].text
    assert "the root's item" not in runner.requests[-1].text

    # A link a tool planted in the chat's directory is not followed out of it: the root's file counts.
    secret = tmp_path / "daemon-secret.txt"
    secret.write_text("- token 123:ABC\n")
    (chat_dir / "HEARTBEAT.md").unlink()
    (chat_dir / "HEARTBEAT.md").symlink_to(secret)
    await hb.fire(NOON + timedelta(minutes=60))
    assert "token 123" not in runner.requests[-1].text and "- the root's item" in runner.requests[-1].text


async def test_active_hours_lost_to_the_spring_forward_jump_still_run_once(
    redis_client: aioredis.Redis, redis_prefix: str, tmp_path: Path
) -> None:
    write_checklist(tmp_path)
    runner = RecordingRunner()
    clock = ManualClock(datetime(2027, 3, 27, 22, 0, tzinfo=UTC))
    hb = make(redis_client, redis_prefix, tmp_path, runner, clock,
              active_hours="02:00-03:00", timezone="Europe/Berlin")
    fire_time = clock.now
    while fire_time < datetime(2027, 3, 28, 22, 0, tzinfo=UTC):  # the whole local Sunday, every 30 min
        clock.now = fire_time
        await hb.fire(fire_time)
        fire_time += timedelta(minutes=30)
    assert [r.meta["fire_time"] for r in runner.requests] == ["2027-03-28T01:00:00Z"]  # 03:00 CEST
