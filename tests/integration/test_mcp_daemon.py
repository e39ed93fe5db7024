"""MCP servers inside the daemon: they start in the background, a broken one stops nothing, /stop cancels a call."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent.tools.mcp_spec import run_directly
from bot.config import BotdConfig
from bot.mcp_servers import doctor_checks
from tests.fakes.mcp_rig import FAKE_SERVER
from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.integration.gateway_harness import roles, running_daemon, wait_until


def servers(markers: Path) -> dict[str, object]:
    return {
        "servers": {
            "fake": {
                "command": sys.executable, "args": [str(FAKE_SERVER), "stdio"],
                "env": {"FAKE_MCP_MARKERS": str(markers)}, "timeout_s": 30,
            },
            "broken": {"command": str(markers / "no-such-server")},
        }
    }


def sandboxed_markers(markers: Path) -> dict[str, object]:
    """The servers run in the tool sandbox: the marker directory is one of its writable places."""
    return {"tool_timeout_s": 30, "allowed_paths": [str(markers)]}


async def test_chat_uses_mcp_tools_while_a_broken_server_is_retried(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    async with FakeOpenAI() as fake, running_daemon(
        tmp_path, fake, redis_url, redis_prefix, mcp=servers(markers), security=sandboxed_markers(markers)
    ) as bot:
        mcp = bot.app.mcp
        await wait_until(lambda: mcp.connections["fake"].state == "ready", timeout=30, what="the fake server")
        await wait_until(lambda: mcp.connections["broken"].restarts >= 1, timeout=30, what="a retry")
        fake.script(Reply.tool_calls([Call("fake__add", {"a": 20, "b": 22})]), Reply.text("It is 42."))
        await bot.send("add them")
        await bot.channel.wait_for(lambda ch: ch.texts("part"), timeout=30)
        assert bot.channel.texts("part") == ["It is 42."]
        await bot.wait_idle(timeout=30)  # the run has ended, its messages recorded
        history = await bot.history()
        assert [m.content for m in history if m.role == "tool"] == ["42"]
        schemas = fake.requests[0]["tools"]
        assert "fake__add" in [s["function"]["name"] for s in schemas]
        broken = next(s for s in mcp.snapshot() if s.name == "broken")
        assert broken.state == "restarting" and "could not start" in (broken.last_error or "")


async def test_stop_cancels_a_running_mcp_call(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    async with FakeOpenAI() as fake, running_daemon(
        tmp_path, fake, redis_url, redis_prefix, mcp=servers(markers), security=sandboxed_markers(markers)
    ) as bot:
        await wait_until(lambda: bot.app.mcp.connections["fake"].state == "ready", timeout=30, what="the server")
        fake.script(
            Reply.tool_calls([Call("fake__slow", {"seconds": 60, "tag": "stop"})]),
            Reply.text("should never be asked for"),
        )
        await bot.send("wait a minute")
        await wait_until(lambda: (markers / "started-stop").exists(), what="the call to reach the server")
        await bot.send("/stop")
        await wait_until(lambda: (markers / "cancelled-stop").exists(), timeout=10, what="the server's cancel")
        await bot.wait_idle(timeout=30)
        assert bot.channel.texts("notice") == ["Stopped."]
        assert len(fake.requests) == 1
        assert roles(await bot.history()) == ["user", "assistant", "tool"]


async def test_a_stdio_server_runs_in_the_tool_sandbox(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    config = tmp_path / "botd-secret.yaml"
    config.write_text("llm: {api_key: sk-not-for-tools}\n", encoding="utf-8")
    async with FakeOpenAI() as fake, running_daemon(
        tmp_path, fake, redis_url, redis_prefix, mcp=servers(markers), security=sandboxed_markers(markers)
    ) as bot:
        if not bot.app.tool_settings.sandbox.active:
            pytest.skip("bubblewrap cannot run here")
        await wait_until(lambda: bot.app.mcp.connections["fake"].state == "ready", timeout=30, what="the server")
        workspace = bot.app.cfg.workspace
        (workspace / "users" / "telegram-1").mkdir(parents=True)
        (workspace / "users" / "telegram-1" / "MEMORY.md").write_text("another user's notes")
        targets = [workspace / ".botd" / "daemon.key", workspace / "users" / "telegram-1" / "MEMORY.md",
                   markers / "starts"]
        fake.script(
            Reply.tool_calls([Call("fake__peek", {"path": str(target)}) for target in targets]), Reply.text("done")
        )
        await bot.send("look around")
        await bot.wait_idle(timeout=30)
        results = [m.content for m in await bot.history() if m.role == "tool"]
        assert results[0].startswith("unreadable") and results[1].startswith("unreadable"), results
        assert results[2] == "readable"  # an allowed path is visible to it


async def test_doctor_checks_each_server_on_its_own(tmp_path: Path) -> None:
    fake = [str(FAKE_SERVER)]
    cfg = BotdConfig.model_validate({
        "agent": {"workspace": str(tmp_path / "ws")},
        "mcp": {"servers": {
            "fake": {"command": sys.executable, "args": [*fake, "stdio"], "disabled_tools": ["crash"]},
            "broken": {"command": sys.executable, "args": [*fake, "fail"]},
            "unset": {"command": "x", "env": {"T": "${BOTD_TEST_NOT_SET}"}},
            "off": {"command": "x", "enabled": False},
        }},
    })
    checks = {name: (ok, detail) for name, ok, detail in await doctor_checks(cfg, run_directly)}
    assert set(checks) == {"mcp:fake", "mcp:broken", "mcp:unset"}
    assert checks["mcp:fake"][0] and checks["mcp:fake"][1].startswith("stdio, ") and "tools offered" in checks["mcp:fake"][1]
    assert not checks["mcp:broken"][0] and "the configuration is missing" in checks["mcp:broken"][1]
    assert not checks["mcp:unset"][0] and "mcp.servers.unset.env.T" in checks["mcp:unset"][1]
