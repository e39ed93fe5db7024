"""``botd cron`` as a new user types it: next, run-now without a daemon or with a failing run, console."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import structlog

from bot.cli import main
from bot.store.keys import Keys
from scheduler.cron_commands import CronAddOptions, cron_add
from scheduler.jobs import RunRecord
from scheduler.store import JobStore, RunNowQueue


def write_config(tmp_path: Path, redis_url: str, prefix: str) -> str:
    path = tmp_path / "botd.yaml"
    path.write_text(
        f"agent: {{workspace: {tmp_path / 'ws'}}}\n"
        f"redis: {{url: '{redis_url}', prefix: {prefix}}}\n"
        "scheduler: {timezone: Europe/Berlin}\n",
        encoding="utf-8",
    )
    return str(path)


@pytest.fixture(autouse=True)
def keep_logging() -> Iterator[None]:
    # main() binds the process-wide log output to this test's captured stderr: put it back after.
    saved, root = structlog.get_config(), logging.getLogger()
    handlers = list(root.handlers)
    loggers = [root, *(lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger))]
    levels = {lg: lg.level for lg in loggers}
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    for lg, level in levels.items():
        lg.setLevel(level)


def add_job(config: str, capsys: pytest.CaptureFixture[str], job_id: str, *schedule: str) -> None:
    argv = ["cron", "add", *schedule, "--channel", "telegram", "--chat-id", "5", "--prompt", "p", "--id", job_id]
    assert main([*argv, "--config", config]) == 0
    assert capsys.readouterr().out.strip() == job_id


@pytest.fixture
def config(tmp_path: Path, redis_url: str, redis_prefix: str) -> str:
    return write_config(tmp_path, redis_url, redis_prefix)


def test_next_with_an_inline_spec_needs_no_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing listens on this socket: an inline spec must not try to reach a store.
    path = tmp_path / "botd.yaml"
    path.write_text("redis: {url: 'redis://127.0.0.1:9/0'}\n", encoding="utf-8")
    argv = ["cron", "next", "--cron", "15,45 2 * * *", "--tz", "Europe/Berlin",
            "--after", "2027-03-27T12:00:00Z", "--count", "3", "--config", str(path)]
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines() == [
        "2027-03-28T03:00:00+02:00",  # 02:15 and 02:45 were skipped by the change: once, at the jump
        "2027-03-29T02:15:00+02:00",
        "2027-03-29T02:45:00+02:00",
    ]
    assert main([*argv[:-4], "--json", "--count", "1", "--config", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == ["2027-03-28T03:00:00+02:00"]


def test_next_for_every_and_at(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "botd.yaml"
    path.write_text("scheduler: {timezone: Europe/Berlin}\n", encoding="utf-8")
    assert main(["cron", "next", "--every", "90m", "--after", "2027-03-28T00:00:00Z", "--count", "2",
                 "--config", str(path)]) == 0
    # Exact elapsed time across the change, shown in UTC.
    assert capsys.readouterr().out.split() == ["2027-03-28T01:30:00+00:00", "2027-03-28T03:00:00+00:00"]
    # A naive --at is read in scheduler.timezone; a skipped wall time runs at the jump.
    assert main(["cron", "next", "--at", "2027-03-28T02:30", "--after", "2027-03-01T00:00:00Z",
                 "--config", str(path)]) == 0
    assert capsys.readouterr().out.split() == ["2027-03-28T03:00:00+02:00"]
    assert main(["cron", "next", "--at", "2027-03-28T02:30", "--after", "2027-04-01T00:00:00Z", "--json",
                 "--config", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cron", "0 0 30 2 *"], "never fires"),
        (["--cron", "0 9 * * *", "--every", "1h"], "exactly one of"),
        ([], "exactly one of"),
        (["--cron", "@daily", "--tz", "Mars/Olympus"], "unknown IANA timezone"),
        (["--cron", "@daily", "--after", "soon"], "after: 'soon' is not an ISO-8601 time"),
        (["--cron", "@daily", "--count", "0"], "count: must be"),
        (["--cron", "@daily", "--after", "0001-01-01T00:00:00+05:00"], "outside the years"),
        (["--at", "9999-12-31T23:59", "--tz", "America/New_York"], "out of range"),
        (["--cron", "\u0663 * * * *"], "not a number"),
    ],
)
def test_next_rejects_bad_input_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    path = tmp_path / "botd.yaml"
    path.write_text("{}\n", encoding="utf-8")
    assert main(["cron", "next", *argv, "--config", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_next_and_list_for_a_stored_job_agree(
    config: str, redis_url: str, redis_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    add_job(config, capsys, "midnight", "--cron", "0 0 * * *")
    assert main(["cron", "next", "midnight", "--count", "1", "--json", "--config", config]) == 0
    [upcoming] = json.loads(capsys.readouterr().out)
    assert upcoming.endswith(("+01:00", "+02:00"))  # shown in the job's zone (scheduler.timezone)
    assert main(["cron", "list", "--json", "--config", config]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert datetime.fromisoformat(row["next_run"].replace("Z", "+00:00")) == datetime.fromisoformat(upcoming)
    assert main(["cron", "next", "missing", "--config", config]) == 2
    assert "no cron job with id 'missing'" in capsys.readouterr().err


def test_console_channel_is_refused(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["cron", "add", "--in", "20m", "--channel", "console", "--chat-id", "me", "--prompt", "hi"]
    assert main([*argv, "--config", config]) == 2
    assert "console cannot receive scheduled runs" in capsys.readouterr().err
    assert main(["cron", "list", "--json", "--config", config]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_run_now_without_a_daemon_fails_and_queues_nothing(
    config: str, redis_url: str, redis_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    add_job(config, capsys, "hourly", "--every", "1h")
    assert main(["cron", "run-now", "hourly", "--wait", "5", "--config", config]) == 1
    captured = capsys.readouterr()
    assert "no running daemon" in captured.err and "requested" not in captured.out

    async def pending() -> int:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            return await RunNowQueue(client, Keys(redis_prefix)).pending()
        finally:
            await client.aclose()

    assert asyncio.run(pending()) == 0


class FailingDaemon:
    """Stands in for a scheduler: listens on the change channel and answers run-now with a failure."""

    def __init__(self, redis_url: str, prefix: str, status: str, error: str | None) -> None:
        self._url, self._prefix, self._status, self._error = redis_url, prefix, status, error
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    def __enter__(self) -> FailingDaemon:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    async def _serve(self) -> None:
        client = aioredis.Redis.from_url(self._url, decode_responses=True)
        store = JobStore(client, Keys(self._prefix))
        pubsub = client.pubsub()
        await pubsub.subscribe(store.changes_channel)
        self._ready.set()
        try:
            while not self._stop.is_set():
                await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)
                request = await store.run_now_queue.pop()
                if request is None:
                    continue
                now = datetime.now(UTC)
                await store.ledger.append(
                    RunRecord(job_id=request.job_id, request_id=request.request_id, trigger="run_now",
                              started_at=now, finished_at=now, run_status=self._status,  # type: ignore[arg-type]
                              error=self._error)
                )
        finally:
            await pubsub.aclose()
            await client.aclose()


@pytest.mark.parametrize(("status", "code"), [("error", 1), ("timeout", 1), ("skipped", 0), ("ok", 0)])
def test_run_now_wait_exit_code_follows_the_run(
    config: str, redis_url: str, redis_prefix: str, capsys: pytest.CaptureFixture[str], status: str, code: int
) -> None:
    async def add() -> None:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            await cron_add(JobStore(client, Keys(redis_prefix)),
                           CronAddOptions(prompt="p", channel="telegram", chat_id="5", in_="20m", job_id="remind"))
        finally:
            await client.aclose()

    asyncio.run(add())
    reason = "telegram is not enabled" if status != "ok" else None
    with FailingDaemon(redis_url, redis_prefix, status, reason):
        assert main(["cron", "run-now", "remind", "--wait", "10", "--config", config]) == code
    captured = capsys.readouterr()
    assert captured.out.startswith("requested ")
    assert json.loads(captured.out.splitlines()[-1])["run_status"] == status
    if code:
        assert f"run {status}: telegram is not enabled" in captured.err

