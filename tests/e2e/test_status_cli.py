"""``botd status``, ``--version`` and a second ``botd run``, as real processes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bot import __version__
from tests.e2e.botd_process import botd_run, free_port, write_config
from tests.e2e.cli_rig import TELEGRAM_TOKEN, assert_no_traceback, botd
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram

pytestmark = pytest.mark.e2e


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
    report = json.loads((await botd("status", "--json", cwd=tmp_path)).out)
    assert report["daemons"] == [] and report["store"]["ok"] is True and report["version"] == __version__


async def test_status_when_the_store_is_unreachable(tmp_path: Path) -> None:
    path = write_config(tmp_path / "botd.yaml", {"redis": {"url": f"redis://127.0.0.1:{free_port()}/0"}})
    result = await botd("status", "--config", str(path), cwd=tmp_path, timeout_s=20)
    assert result.rc == 1 and "store: not available" in result.out
    assert_no_traceback(result)


async def test_status_sees_a_running_daemon_its_channel_and_cron_fires(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as llm, FakeTelegram(TELEGRAM_TOKEN) as tg:
        cfg = config(tmp_path, llm, tg, redis_url, redis_prefix)
        path = write_config(tmp_path / "botd.yaml", cfg)
        added = await botd("cron", "add", "--every", "1h", "--channel", "telegram", "--chat-id", "42",
                           "--prompt", "check", "--id", "hourly", "--config", str(path), cwd=tmp_path)
        assert added.rc == 0, added.text
        async with botd_run(path, cfg["http"]["port"], tmp_path) as daemon:
            await daemon.wait_healthy()
            report: dict[str, Any] = {}
            for _ in range(100):  # the channel reports ready once polling runs
                report = json.loads((await botd("status", "--json", "--config", str(path), cwd=tmp_path)).out)
                if report["daemons"] and report["daemons"][0]["channels"].get("telegram"):
                    break
                await asyncio.sleep(0.2)
            (replica,) = report["daemons"]
            assert replica["channels"] == {"telegram": True} and replica["http_port"] == cfg["http"]["port"]
            assert report["next_cron"][0]["id"] == "hourly"
            text = await botd("status", "--config", str(path), cwd=tmp_path)
            assert "daemons: 1 running" in text.out and "telegram: enabled, polling" in text.out
            assert "ready on 1 of 1 daemon(s)" in text.out and "hourly" in text.out
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
