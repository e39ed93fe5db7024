"""Scheduler end to end: ``botd run`` with cron jobs and the heartbeat, driven by the CLI.

One botd process (Telegram in polling mode against the fake Bot API, so every delivery
is observable; the fake LLM) serves the whole module, and the CLI runs as separate
processes with the same ``--config`` — exactly how an operator uses them. Every test has
its own chat and its own marker words, and the fake LLM answers by marker, so the tests
share nothing and do not depend on their order.

The heartbeat is enabled (``every: 30m``) with ``active_hours`` set to an hour of the day
far from now, so a fire of its own (on the :00/:30 grid) does nothing during the test;
``botd cron run-now heartbeat`` ignores the active hours.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from tests.e2e.botd_process import BOTD, BotdProcess, botd_run, clean_env, free_port, write_config
from tests.fakes.marker_router import Router, last_user_text
from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.fakes.telegram_server import FakeTelegram, SentMessage

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

TOKEN = "424242:TEST-token-for-the-scheduler"
AGENT = "main"

# Telegram private chats (the chat id is the user's id); each test has its own.
C_AT = 3101
C_SILENT = 3102
C_HEARTBEAT = 3103  # heartbeat.target
U_TOOL = 3104  # the one allowed user: creates a job with the cron tool
C_ADMIN = 3105
C_REMOVED = 3106

ECHO = shutil.which("echo") or "/bin/echo"
TOUCH = shutil.which("touch") or "/usr/bin/touch"


def tools_yaml(marker_dir: Path) -> str:
    return f"""
tools:
  - name: say
    description: Print a text.
    category: read
    cmd: {ECHO}
    args: ["{{{{text}}}}"]
    parameters:
      text: {{type: string, maxLength: 200}}
  - name: touch_marker
    description: Create a marker file (an admin action).
    category: admin
    cmd: {TOUCH}
    args: ["{marker_dir}/{{{{name}}}}"]
    parameters:
      name: {{type: string, pattern: "[a-z0-9-]{{1,40}}"}}
"""


def cron_key(job_id: str) -> str:
    return f"agent:{AGENT}:cron:{job_id}"


HEARTBEAT_KEY = f"agent:{AGENT}:heartbeat"


async def until(
    check: Callable[[], Awaitable[Any]] | Callable[[], Any], within: float = 15.0, what: str = "condition"
) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy; return that."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(0.05)


# -- the fake model: replies chosen by a marker word in the last user message ------------


def tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "tool"]


# -- one botd for the module --------------------------------------------------------------


@dataclass
class Sched:
    tg: FakeTelegram
    llm: FakeOpenAI
    router: Router
    botd: BotdProcess
    config_path: Path
    workdir: Path
    workspace: Path
    marker_dir: Path
    prefix: str
    redis: aioredis.Redis

    # the CLI ------------------------------------------------------------------------------
    async def cli(self, *args: str, timeout_s: float = 60.0) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *BOTD,
            "--config",
            str(self.config_path),
            *args,
            cwd=str(self.workdir),
            env=clean_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AssertionError(f"botd {' '.join(args)} did not finish in {timeout_s:g} s") from None
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def add(self, *args: str) -> str:
        """``botd cron add --channel telegram …``; returns the printed job id."""
        rc, out, err = await self.cli("cron", "add", "--channel", "telegram", *args)
        assert rc == 0, f"cron add failed ({rc}): {err}"
        job_id = out.strip()
        assert job_id and len(job_id.split()) == 1, out
        return job_id

    async def jobs(self) -> dict[str, dict[str, Any]]:
        """``botd cron list --json`` by job id."""
        rc, out, err = await self.cli("cron", "list", "--json")
        assert rc == 0, err
        return {row["id"]: row for row in json.loads(out)}

    async def run_now(self, job_id: str, wait_s: float = 30.0) -> dict[str, Any]:
        """``botd cron run-now ID --wait S``; returns the ledger record it prints."""
        rc, out, err = await self.cli(
            "cron", "run-now", job_id, "--wait", f"{wait_s:g}", timeout_s=wait_s + 30
        )
        assert rc == 0, f"run-now {job_id} failed ({rc}): {out}\n{err}\n{self.botd.log()[-3000:]}"
        lines = out.strip().splitlines()
        assert lines[0].startswith("requested "), out
        record: dict[str, Any] = json.loads(lines[-1])
        assert record["job_id"] == job_id and record["request_id"] == lines[0].split()[1]
        assert record["trigger"] == "run_now"
        return record

    # Redis: the run ledger outlives a removed (one-shot) job ------------------------------
    async def ledger(self, job_id: str) -> list[dict[str, Any]]:
        raw = await self.redis.lrange(f"{self.prefix}:cron:runs:{job_id}", 0, -1)
        return [json.loads(item) for item in raw]

    async def wait_ledger(self, job_id: str, within: float = 20.0) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = await until(
            lambda: self.ledger(job_id), within, f"a ledger entry for {job_id}\n{self.botd.log()[-3000:]}"
        )
        return records

    # outbound -----------------------------------------------------------------------------
    def texts(self, chat_id: int) -> list[str]:
        return [m.text for m in self.tg.sent_messages(chat_id)]

    def sends_to(self, chat_id: int) -> list[Any]:
        return [c for c in self.tg.calls_to("sendMessage") if str(c.params.get("chat_id")) == str(chat_id)]

    async def wait_text(self, chat_id: int, needle: str, within: float = 20.0) -> SentMessage:
        def found() -> SentMessage | None:
            return next((m for m in self.tg.sent_messages(chat_id) if needle in m.text), None)

        message: SentMessage = await until(
            found, within, f"{needle!r} in chat {chat_id}: {self.texts(chat_id)}\n{self.botd.log()[-3000:]}"
        )
        return message

    def requests_for(self, marker: str) -> list[dict[str, Any]]:
        return [r for r in self.llm.requests if marker in last_user_text(r)]

    def runs_finished(self, session_key: str) -> list[dict[str, Any]]:
        out = []
        for line in self.botd.log().splitlines():
            if "run.finished" not in line:
                continue
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("event") == "run.finished" and record.get("session_key") == session_key:
                    out.append(record)
        return out


def outside_now_window() -> str:
    """An hour of the day (UTC) that starts six hours from now: never active during the test."""
    start = (datetime.now(UTC) + timedelta(hours=6)).hour
    return f"{start:02d}:00-{(start + 1) % 24:02d}:00"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sched(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> AsyncIterator[Sched]:
    workdir = tmp_path_factory.mktemp("sched")
    workspace = workdir / "ws"
    workspace.mkdir()
    marker_dir = workdir / "markers"
    marker_dir.mkdir()
    tools = workdir / "tools.yaml"
    tools.write_text(tools_yaml(marker_dir), encoding="utf-8")
    (workspace / "HEARTBEAT.md").write_text("# Heartbeat\n\n- look around\n", encoding="utf-8")
    prefix = f"e2esched{uuid.uuid4().hex[:8]}"
    port = free_port()
    router = Router(default=lambda _text: Reply.text("unscripted answer"))
    async with FakeTelegram(TOKEN) as tg, FakeOpenAI(responder=router) as llm:
        config = {
            "agent": {"id": AGENT, "workspace": str(workspace)},
            "llm": {
                "base_url": llm.base_url,
                "api_key": "test-key",
                "max_retries": 0,
                "request_timeout_s": 30,
            },
            "redis": {"url": redis_url, "prefix": prefix},
            "http": {"port": port},
            "telegram": {
                "enabled": True,
                "token": TOKEN,
                "api_base_url": tg.base_url,
                "mode": "polling",
                "allow_from": [str(U_TOOL)],
            },
            "queue": {"debounce_ms": 0},
            "gateway": {"shutdown_grace_s": 2},
            # The marker tool writes outside the workspace: tool processes may write only there.
            "security": {"cli_tools_file": str(tools), "allowed_paths": [str(workspace), str(marker_dir)]},
            "heartbeat": {
                "enabled": True,
                "every": "30m",
                "active_hours": outside_now_window(),
                "target": {"channel": "telegram", "chat_id": str(C_HEARTBEAT)},
            },
            "log": {"level": "info"},
        }
        path = write_config(workdir / "botd.yaml", config)
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            async with botd_run(path, port, workdir) as botd:
                await botd.wait_healthy()
                ready: list[tuple[int, str]] = []

                async def is_ready() -> bool:
                    with contextlib.suppress(aiohttp.ClientError, OSError):
                        ready.append(await botd.get("/readyz"))
                        return ready[-1][0] == 200
                    return False

                await until(is_ready, 20, f"readiness: {ready[-1:]}\n{botd.log()[-3000:]}")
                yield Sched(tg, llm, router, botd, path, workdir, workspace, marker_dir, prefix, client)
                assert await botd.terminate() == 0, botd.log()[-3000:]
        finally:
            await client.aclose()


# -- 1. a one-shot job from the CLI ---------------------------------------------------------


async def test_at_job_fires_once_delivers_and_is_removed(sched: Sched) -> None:
    sched.router.on("mk-at-fire", Reply.text("The nightly build is green."))
    # Far enough ahead that a slow CLI start on a loaded machine still adds it in the future.
    at = (datetime.now(UTC) + timedelta(seconds=15)).replace(microsecond=0)
    job_id = await sched.add(
        "--at", at.isoformat(), "--chat-id", str(C_AT), "--prompt", "mk-at-fire check the build"
    )

    await sched.wait_text(C_AT, "The nightly build is green.", within=40.0)
    [record] = await sched.wait_ledger(job_id)
    assert record["run_status"] == "ok" and record["delivery_status"] == "delivered", record
    assert record["trigger"] == "schedule"
    assert datetime.fromisoformat(record["fire_time"]) == at
    assert datetime.fromisoformat(record["started_at"]) >= at

    # A one-shot that ran is gone (removed just after its ledger entry is written); the ledger stays.
    async def removed() -> bool:
        return job_id not in await sched.jobs()

    await until(removed, 10.0, f"{job_id} removed after its run")
    assert sched.texts(C_AT) == ["The nightly build is green."]
    assert len(sched.sends_to(C_AT)) == 1
    [request] = sched.requests_for("mk-at-fire")
    prompt = last_user_text(request)
    assert prompt.startswith(f'[Scheduled task] Cron job "{job_id}"') and prompt.endswith("check the build")
    [finished] = sched.runs_finished(cron_key(job_id))
    assert finished["kind"] == "cron" and finished["delivery"] == "delivered"


# -- 2. NO_REPLY anywhere in a cron answer ---------------------------------------------------


async def test_no_reply_word_in_a_cron_answer_delivers_nothing(sched: Sched) -> None:
    sched.router.on("mk-silent-fire", Reply.text("Nothing new since yesterday, so NO_REPLY."))
    job_id = await sched.add(
        "--in", "2s", "--chat-id", str(C_SILENT), "--prompt", "mk-silent-fire look for news"
    )

    [record] = await sched.wait_ledger(job_id)
    assert record["run_status"] == "ok" and record["delivery_status"] == "silent", record
    assert len(sched.requests_for("mk-silent-fire")) == 1
    assert sched.tg.sent_messages(C_SILENT, include_deleted=True) == []
    assert sched.sends_to(C_SILENT) == []
    assert not any("NO_REPLY" in str(c.params.get("text")) for c in sched.tg.calls)
    async def removed() -> bool:  # just after the ledger entry is written
        return await sched.redis.exists(f"{sched.prefix}:cron:job:{job_id}") == 0

    await until(removed, 10.0, f"{job_id} removed after its run")


# -- 3. the heartbeat --------------------------------------------------------------------------


async def test_heartbeat_run_now_ok_alert_and_empty_file(sched: Sched) -> None:
    heartbeat_md = sched.workspace / "HEARTBEAT.md"

    # HEARTBEAT_OK (with a short remark): nothing reaches the chat.
    heartbeat_md.write_text("# Checks\n\n- mk-hb-quiet: is the disk filling up?\n", encoding="utf-8")
    sched.router.on("mk-hb-quiet", Reply.text("All checks passed. HEARTBEAT_OK"))
    record = await sched.run_now("heartbeat")
    assert record["run_status"] == "ok" and record["delivery_status"] == "silent", record
    [request] = sched.requests_for("mk-hb-quiet")
    assert "HEARTBEAT.md:" in last_user_text(request)
    assert sched.tg.sent_messages(C_HEARTBEAT, include_deleted=True) == []

    # An alert without the token is delivered to heartbeat.target.
    heartbeat_md.write_text("# Checks\n\n- mk-hb-alert: is the disk filling up?\n", encoding="utf-8")
    sched.router.on("mk-hb-alert", Reply.text("Disk almost full: / is at 97%."))
    record = await sched.run_now("heartbeat")
    assert record["run_status"] == "ok" and record["delivery_status"] == "delivered", record
    await sched.wait_text(C_HEARTBEAT, "Disk almost full")
    assert sched.texts(C_HEARTBEAT) == ["Disk almost full: / is at 97%."]
    assert len(sched.runs_finished(HEARTBEAT_KEY)) == 2

    # Only headings, comments and empty items: skipped without asking the model.
    heartbeat_md.write_text("# Checks\n\n<!-- add tasks here -->\n## Later\n- [ ]\n", encoding="utf-8")
    asked = len(sched.llm.requests)
    record = await sched.run_now("heartbeat")
    assert record["run_status"] == "skipped" and "empty" in (record["error"] or ""), record
    assert len(sched.llm.requests) == asked
    assert len(sched.runs_finished(HEARTBEAT_KEY)) == 2
    assert sched.texts(C_HEARTBEAT) == ["Disk almost full: / is at 97%."]
    ledger = await sched.ledger("heartbeat")
    assert [r["run_status"] for r in ledger[:3]] == ["skipped", "ok", "ok"]


# -- 4. a job made from a chat with the cron tool ---------------------------------------------


async def test_cron_tool_in_a_dm_schedules_a_job_for_that_chat(sched: Sched) -> None:
    sched.router.on(
        "mk-tool-ask",
        Reply.tool_calls(
            [Call("cron", {"action": "add", "in": "5s", "prompt": "mk-tool-fire say the reminder"})]
        ),
        Reply.text("Done: I will remind you in a few seconds."),
    )
    sched.router.on("mk-tool-fire", Reply.text("Reminder: stretch your legs."))
    sched.tg.push_update({"message": sched.tg.private_message(U_TOOL, "mk-tool-ask remind me soon")})

    # Once the model is asked again, the tool has run: the job exists and has not fired yet.
    await until(lambda: len(sched.requests_for("mk-tool-ask")) >= 2, 15, "the request after the cron tool")
    [result] = tool_messages(sched.requests_for("mk-tool-ask")[1])
    assert "Scheduled cron job" in str(result["content"]), result
    [job] = [row for row in (await sched.jobs()).values() if "mk-tool-fire" in row["prompt"]]
    chat = {"channel": "telegram", "chat_id": str(U_TOOL), "thread_id": None}
    assert job["target"] == chat and job["created_in"] == chat
    assert job["schedule_spec"]["kind"] == "at" and job["enabled"] and job["next_run"]

    await sched.wait_text(U_TOOL, "Reminder: stretch your legs.")
    [record] = await sched.wait_ledger(job["id"])
    assert record["run_status"] == "ok" and record["delivery_status"] == "delivered", record
    assert sched.texts(U_TOOL) == [
        "Done: I will remind you in a few seconds.",
        "Reminder: stretch your legs.",
    ]
    [fire] = sched.requests_for("mk-tool-fire")
    assert last_user_text(fire).startswith("[Scheduled task]")
    assert "mk-tool-ask" not in json.dumps(fire["messages"])  # a fresh cron session, not the DM's
    assert job["id"] not in await sched.jobs()


# -- 5. admin tools in scheduled runs -----------------------------------------------------------


async def test_admin_tool_is_blocked_in_a_cron_run_unless_the_job_allows_it(sched: Sched) -> None:
    prompt = "mk-admin-job touch the marker"
    # Same answers for both runs: a read tool and the admin tool in one turn, then a text.
    for _ in range(2):
        sched.router.on(
            "mk-admin-job",
            Reply.tool_calls(
                [Call("say", {"text": "read-ok"}), Call("touch_marker", {"name": "cron-marker"})]
            ),
            Reply.text("Marker step done."),
        )
    marker = sched.marker_dir / "cron-marker"
    blocked, allowed = await asyncio.gather(
        sched.add("--in", "1h", "--chat-id", str(C_ADMIN), "--prompt", prompt),
        sched.add("--in", "1h", "--chat-id", str(C_ADMIN), "--prompt", prompt, "--allow", "admin"),
    )

    record = await sched.run_now(blocked)
    assert record["run_status"] == "ok", record
    _, second_turn = sched.requests_for("mk-admin-job")
    say, touch = tool_messages(second_turn)
    assert "read-ok" in str(say["content"])  # read tools run in a scheduled run
    assert "not allowed in a scheduled run" in str(touch["content"]), touch
    assert "touch_marker" in str(touch["content"])
    assert not marker.exists(), "the blocked admin tool ran"

    record = await sched.run_now(allowed)
    assert record["run_status"] == "ok", record
    assert marker.exists(), "the allowed admin tool did not run"
    _, _, _, second_turn = sched.requests_for("mk-admin-job")
    say, touch = tool_messages(second_turn)
    assert "read-ok" in str(say["content"])
    assert "not allowed" not in str(touch["content"]) and "Error" not in str(touch["content"]), touch
    assert sched.texts(C_ADMIN) == ["Marker step done.", "Marker step done."]
    jobs = await sched.jobs()  # a run-now does not use up a one-shot
    assert jobs[blocked]["allow"] == [] and jobs[allowed]["allow"] == ["admin"]


# -- 6. removing a job before it fires ---------------------------------------------------------


async def test_removed_job_never_fires(sched: Sched) -> None:
    added = time.monotonic()
    job_id = await sched.add(
        "--in", "6s", "--chat-id", str(C_REMOVED), "--prompt", "mk-removed-fire too late"
    )
    rc, out, err = await sched.cli("cron", "rm", job_id)
    assert rc == 0 and out.strip() == f"removed {job_id}", (rc, out, err)
    assert job_id not in await sched.jobs()

    # Past the time it would have fired, with room for a late fire.
    await asyncio.sleep(max(0.0, added + 6 + 2.5 - time.monotonic()))
    assert sched.requests_for("mk-removed-fire") == []
    assert sched.tg.sent_messages(C_REMOVED, include_deleted=True) == []
    assert sched.runs_finished(cron_key(job_id)) == []
    assert await sched.ledger(job_id) == []
    rc, _, err = await sched.cli("cron", "rm", job_id)
    assert rc == 2 and job_id in err
