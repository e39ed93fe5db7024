"""Attacks through the whole daemon: ``botd run`` against the fake Telegram and the fake LLM.

The fake model plays the attacker (a steered model calls the tools); the daemon has
fake secrets in its environment and config file and its embedded store on the
workspace. Each test asserts on harm: a secret in a tool result, the store touched,
the daemon killed, a process left behind. With the sandbox on, all of it must hold;
with it off, the guarantees that hold regardless (file-tool boundaries, botd's files).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from agent.tools.sandbox import probe_bwrap
from bot.store.embedded import EmbeddedPaths
from tests.e2e.botd_process import BotdProcess, botd_run, free_port, write_config
from tests.fakes.marker_router import Router, last_user_text
from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.fakes.telegram_server import FakeTelegram

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

TOKEN = "123456:FAKE-telegram-token-e2e-sec"
API_KEY = "sk-FAKE-openai-key-e2e-sec"
SIGNING = "FAKE-slack-signing-secret-e2e"
SECRETS = (TOKEN, API_KEY, SIGNING)
USERS = list(range(3001, 3012))
NEEDS_BWRAP = pytest.mark.skipif(probe_bwrap() is not None, reason="bubblewrap unusable here")


@dataclass
class Daemon:
    mode: str
    tg: FakeTelegram
    llm: FakeOpenAI
    router: Router
    botd: BotdProcess
    workspace: Path
    config_file: Path

    async def attack(self, user: int, *calls: Call) -> str:
        """Let the model make ``calls`` (one per turn) in ``user``'s DM; the tool results it saw."""
        marker = f"mk{uuid.uuid4().hex[:10]}"
        self.router.on(marker, *(Reply.tool_calls([c]) for c in calls), Reply.text(f"done {marker}"))
        self.tg.push_update({"message": self.tg.private_message(user, f"please {marker}")})
        deadline = time.monotonic() + 60
        while not any(f"done {marker}" in m.text for m in self.tg.sent_messages(user)):
            assert self.botd.proc.returncode is None, f"botd died:\n{self.botd.log()[-3000:]}"
            assert time.monotonic() < deadline, f"no answer for {marker}:\n{self.botd.log()[-3000:]}"
            await asyncio.sleep(0.05)
        requests = [r for r in self.llm.requests if marker in last_user_text(r)]
        return "\n".join(
            str(m.get("content")) for m in requests[-1]["messages"] if m.get("role") == "tool"
        )


@contextlib.asynccontextmanager
async def start(mode: str, workdir: Path) -> AsyncIterator[Daemon]:
    router = Router()
    async with FakeTelegram(TOKEN) as tg, FakeOpenAI(responder=router) as llm:
        workspace = workdir / "ws"
        port = free_port()
        config = {
            "agent": {"workspace": str(workspace)},
            "llm": {"base_url": llm.base_url, "max_retries": 0, "request_timeout_s": 30},
            "http": {"port": port},
            "telegram": {"enabled": True, "token": TOKEN, "api_base_url": tg.base_url,
                         "allow_from": [str(u) for u in USERS]},
            "queue": {"debounce_ms": 0},
            "gateway": {"shutdown_grace_s": 2},
            "security": {"sandbox": mode, "tool_timeout_s": 20},
            "log": {"level": "info"},
        }
        path = write_config(workdir / "botd.yaml", config)
        env = {"OPENAI_API_KEY": API_KEY, "SLACK_SIGNING_SECRET": SIGNING}
        async with botd_run(path, port, workdir, **env) as botd:
            await botd.wait_healthy()
            yield Daemon(mode, tg, llm, router, botd, workspace.resolve(), path.resolve())
            assert await botd.terminate() == 0, botd.log()[-3000:]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandboxed(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Daemon]:
    if probe_bwrap() is not None:
        pytest.skip("bubblewrap unusable here")
    async with start("bwrap", tmp_path_factory.mktemp("sec-on")) as daemon:
        yield daemon


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def unsandboxed(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Daemon]:
    async with start("off", tmp_path_factory.mktemp("sec-off")) as daemon:
        yield daemon


def leaked(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


@NEEDS_BWRAP
async def test_bash_cannot_read_the_daemons_secrets(sandboxed: Daemon) -> None:
    seen = await sandboxed.attack(USERS[0], Call("bash", {"command": (
        "cat /proc/$PPID/environ; tr '\\0' ' ' < /proc/$PPID/cmdline; env; "
        f"cat {sandboxed.config_file}; cat ../../.botd/*; grep -ra FAKE /proc/*/environ"
    )}))
    assert leaked(seen) == []
    assert str(sandboxed.config_file) not in seen or "No such file" in seen


@NEEDS_BWRAP
async def test_bash_cannot_reach_the_store(sandboxed: Daemon) -> None:
    paths = EmbeddedPaths.for_workspace(sandboxed.workspace)
    script = (
        "import socket, glob\n"
        f"for path in glob.glob('{sandboxed.workspace}/**/valkey.sock', recursive=True) + ['{paths.socket}']:\n"
        "    try:\n"
        "        s = socket.socket(socket.AF_UNIX); s.connect(path)\n"
        "        s.sendall(b'*3\\r\\n$3\\r\\nSET\\r\\n$5\\r\\npwned\\r\\n$1\\r\\n1\\r\\n'); print(path, s.recv(100))\n"
        "    except OSError as exc: print(path, exc)\n"
    )
    seen = await sandboxed.attack(USERS[1], Call("write_file", {"path": "x.py", "content": script}),
                                  Call("bash", {"command": "timeout 15 python3 x.py"}))
    assert "+OK" not in seen
    password = paths.password.read_text().strip()
    client = aioredis.Redis.from_url(f"unix://{paths.socket}?password={password}")
    try:
        assert await client.exists("pwned") == 0
    finally:
        await client.aclose()


@NEEDS_BWRAP
async def test_bash_cannot_kill_the_daemon_nor_leave_processes(sandboxed: Daemon) -> None:
    marker = f"77.{uuid.uuid4().int % 10**6}"
    await sandboxed.attack(USERS[2], Call("bash", {"command": (
        f"setsid -f sleep {marker}1; nohup sleep {marker}2 >/dev/null 2>&1 & (sleep {marker}3 &); "
        f"kill -9 {sandboxed.botd.proc.pid}; pkill -9 -f bot.cli; kill -9 $PPID"
    )}))
    await asyncio.sleep(0.5)
    assert sandboxed.botd.proc.returncode is None
    status, _ = await sandboxed.botd.get("/healthz")
    assert status == 200
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if any(marker in a for a in p.info["cmdline"] or [])]
    assert left == []


@NEEDS_BWRAP
async def test_readyz_says_the_sandbox_is_on(sandboxed: Daemon) -> None:
    _status, body = await sandboxed.botd.get("/readyz")
    assert json.loads(body)["sandbox"].startswith("bubblewrap")


async def test_off_is_said_loudly(unsandboxed: Daemon) -> None:
    _, body = await unsandboxed.botd.get("/readyz")
    assert json.loads(body)["sandbox"].startswith("OFF")
    assert "security.sandbox_off" in unsandboxed.botd.log()
    _, metrics = await unsandboxed.botd.get("/metrics")
    assert "botd_tool_sandbox_active 0.0" in metrics


@pytest.mark.parametrize("guarded", ["sandboxed", "unsandboxed"])
async def test_file_tools_never_hand_out_botds_files(guarded: str, request: pytest.FixtureRequest) -> None:
    daemon: Daemon = request.getfixturevalue(guarded)
    user = USERS[4] if guarded == "sandboxed" else USERS[5]
    state = daemon.workspace / ".botd"
    password = (state / "valkey.pass").read_text().strip()
    seen = await daemon.attack(
        user,
        Call("read_file", {"path": str(daemon.config_file)}),
        Call("read_file", {"path": str(state / "valkey.pass")}),
        Call("read_file", {"path": "../../.botd/daemon.key"}),
        Call("list_directory", {"path": str(state)}),
        Call("write_file", {"path": str(state / "planted"), "content": "x"}),
    )
    assert leaked(seen) == [] and password not in seen
    assert "valkey.pass" not in seen.replace(str(state / "valkey.pass"), "")
    assert not (state / "planted").exists()


async def test_a_hard_link_to_the_store_password_is_not_read_back(unsandboxed: Daemon) -> None:
    state = unsandboxed.workspace / ".botd"
    password = (state / "valkey.pass").read_text().strip()
    seen = await unsandboxed.attack(
        USERS[6],
        Call("bash", {"command": f"ln {state / 'valkey.pass'} innocent.txt; ls -l innocent.txt"}),
        Call("read_file", {"path": "innocent.txt"}),
    )
    assert password not in seen
    assert "hard links" in seen


async def test_tool_processes_see_only_allowlisted_environment(unsandboxed: Daemon) -> None:
    seen = await unsandboxed.attack(USERS[7], Call("bash", {"command": "env"}))
    assert leaked(seen) == []
