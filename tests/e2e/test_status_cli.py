"""``botd status``, ``--version`` and a second ``botd run``, as real processes."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.tools.sandbox import Sandbox, probe_bwrap
from bot import __version__
from tests.e2e.botd_process import botd_run, free_port, write_config
from tests.e2e.cli_rig import TELEGRAM_TOKEN, assert_no_traceback, botd
from tests.fakes.mcp_rig import FAKE_SERVER
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram

pytestmark = pytest.mark.e2e

# What security.sandbox auto gives on this machine (CI installs bubblewrap).
HOST_SANDBOX = "bubblewrap (no network)" if probe_bwrap() is None else Sandbox.from_mode("auto").describe()


def config(tmp_path: Path, llm: FakeOpenAI, tg: FakeTelegram, redis_url: str, prefix: str) -> dict[str, Any]:
    return {
        "agent": {"workspace": str(tmp_path / "ws")},
        "llm": {"base_url": llm.base_url, "api_key": "test-key"},
        "redis": {"url": redis_url, "prefix": prefix},
        "http": {"port": free_port()},
        "telegram": {"enabled": True, "token": TELEGRAM_TOKEN, "api_base_url": tg.base_url,
                     "allow_from": ["42"]},
        "gateway": {"shutdown_grace_s": 2},
    }


async def test_version(tmp_path: Path) -> None:
    result = await botd("--version", cwd=tmp_path)
    assert result.rc == 0 and result.out.strip() == f"botd {__version__}"


async def test_status_with_nothing_running(tmp_path: Path) -> None:
    result = await botd("status", cwd=tmp_path, timeout_s=20)
    assert result.rc == 0, result.text
    assert "config: none (defaults and environment)" in result.out
    assert "daemons: none running" in result.out
    assert "telegram: disabled" in result.out and "slack: disabled" in result.out
    assert "sessions: 0" in result.out and "next cron fires: none" in result.out
    assert "Traceback" not in result.text and not result.err  # no log lines either
    assert f"sandbox: {HOST_SANDBOX} (security.sandbox auto, probed on this host)" in result.out
    assert "mcp servers: none configured" in result.out
    report = json.loads((await botd("status", "--json", cwd=tmp_path)).out)
    assert report["daemons"] == [] and report["store"]["ok"] is True and report["version"] == __version__
    assert report["sandbox"]["state"] == HOST_SANDBOX and report["mcp"] == []


async def test_status_without_a_daemon_shows_this_hosts_sandbox_and_mcp_servers_not_running(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    path = write_config(tmp_path / "botd.yaml", {
        "redis": {"url": redis_url, "prefix": redis_prefix},
        "security": {"sandbox": "off"},
        "mcp": {"servers": {"files": {"command": "files-mcp"},
                            "search": {"url": "http://127.0.0.1:9/mcp", "enabled": False}}},
    })
    result = await botd("status", "--config", str(path), cwd=tmp_path, timeout_s=20)
    assert result.rc == 0, result.text
    assert "sandbox: OFF: tools run with the daemon's user rights (security.sandbox is off)" in result.out
    assert "  files: stdio, not running" in result.out
    assert "  search: streamable_http, disabled" in result.out
    report = json.loads((await botd("status", "--json", "--config", str(path), cwd=tmp_path)).out)
    assert report["sandbox"]["mode"] == "off" and report["sandbox"]["state"].startswith("OFF: ")
    assert report["mcp"] == [
        {"name": "files", "transport": "stdio", "enabled": True, "state": "not running"},
        {"name": "search", "transport": "streamable_http", "enabled": False, "state": "disabled"},
    ]


async def test_status_when_the_store_is_unreachable(tmp_path: Path) -> None:
    path = write_config(tmp_path / "botd.yaml", {"redis": {"url": f"redis://127.0.0.1:{free_port()}/0"}})
    result = await botd("status", "--config", str(path), cwd=tmp_path, timeout_s=20)
    assert result.rc == 1 and "store: not available" in result.out
    assert_no_traceback(result)


async def test_status_sees_a_running_daemon_its_channel_sandbox_mcp_and_cron_fires(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    async with FakeOpenAI() as llm, FakeTelegram(TELEGRAM_TOKEN) as tg:
        cfg = config(tmp_path, llm, tg, redis_url, redis_prefix)
        cfg["security"] = {"allowed_paths": [str(markers)]}
        cfg["mcp"] = {"servers": {
            "fake": {"command": sys.executable, "args": [str(FAKE_SERVER), "stdio"],
                     "env": {"FAKE_MCP_MARKERS": str(markers)}},
            "broken": {"command": str(markers / "no-such-server")},
        }}
        path = write_config(tmp_path / "botd.yaml", cfg)
        added = await botd("cron", "add", "--every", "1h", "--channel", "telegram", "--chat-id", "42",
                           "--prompt", "check", "--id", "hourly", "--config", str(path), cwd=tmp_path)
        assert added.rc == 0, added.text
        async with botd_run(path, cfg["http"]["port"], tmp_path) as daemon:
            await daemon.wait_healthy()
            report: dict[str, Any] = {}
            for _ in range(150):  # ready once polling runs and the MCP servers had their first try
                report = json.loads((await botd("status", "--json", "--config", str(path), cwd=tmp_path)).out)
                if report["daemons"] and report["daemons"][0]["channels"].get("telegram"):
                    servers = {s["name"]: s for s in report["daemons"][0]["mcp"]}
                    if servers["fake"]["state"] == "ready" and servers["broken"]["last_error"]:
                        break
                await asyncio.sleep(0.2)
            (replica,) = report["daemons"]
            assert replica["channels"] == {"telegram": True} and replica["http_port"] == cfg["http"]["port"]
            assert replica["sandbox"] == HOST_SANDBOX
            servers = {s["name"]: s for s in replica["mcp"]}
            assert servers["fake"]["state"] == "ready" and servers["fake"]["tools"] > 0
            assert servers["fake"]["last_error"] is None
            assert servers["broken"]["state"] != "ready" and servers["broken"]["tools"] == 0
            assert "could not start" in servers["broken"]["last_error"]
            assert "state" not in report["sandbox"]  # the daemon's own report stands instead of a probe
            assert report["next_cron"][0]["id"] == "hourly"
            text = await botd("status", "--config", str(path), cwd=tmp_path)
            assert "daemons: 1 running" in text.out and "telegram: enabled, polling" in text.out
            assert "ready on 1 of 1 daemon(s)" in text.out and "hourly" in text.out
            assert f"    sandbox: {HOST_SANDBOX}" in text.out
            assert f"    mcp fake: ready, {servers['fake']['tools']} tools" in text.out
            assert "    mcp broken: " in text.out and "last error: could not start" in text.out
            _, metrics = await daemon.get("/metrics")
            assert "botd_redis_up 1.0" in metrics

            second = await botd("run", "--config", str(path), cwd=tmp_path)
            assert second.rc == 1
            assert f"cannot listen on 127.0.0.1:{cfg['http']['port']}" in second.err
            assert_no_traceback(second)
            assert await daemon.terminate() == 0
        gone = json.loads((await botd("status", "--json", "--config", str(path), cwd=tmp_path)).out)
        assert gone["daemons"] == []


async def test_sessions_list_and_reset(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    path = write_config(tmp_path / "botd.yaml", {"redis": {"url": redis_url, "prefix": redis_prefix}})
    empty = await botd("sessions", "list", "--config", str(path), cwd=tmp_path)
    assert empty.rc == 0 and empty.out.strip() == "No sessions."
    missing = await botd("sessions", "reset", "nosuch", "--config", str(path), cwd=tmp_path)
    assert missing.rc == 1 and "no session nosuch" in missing.err
