"""``botd run`` and ``botd chat`` as real processes against the fake LLM."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.e2e.botd_process import BOTD, botd_run, clean_env, free_port, write_config
from tests.fakes.openai_server import FakeOpenAI, Reply

pytestmark = pytest.mark.e2e


def base_config(tmp_path: Path, fake: FakeOpenAI, port: int, redis_url: str, prefix: str) -> dict[str, object]:
    return {
        "agent": {"workspace": str(tmp_path / "ws")},
        "llm": {"base_url": fake.base_url, "api_key": "test-key", "max_retries": 1},
        "redis": {"url": redis_url, "prefix": prefix},
        "http": {"port": port},
        "gateway": {"shutdown_grace_s": 5},
        "log": {"level": "info"},
    }


async def test_run_serves_health_readiness_metrics_and_exits_0_on_sigterm(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as fake:
        port = free_port()
        cfg = write_config(tmp_path / "botd.yaml", base_config(tmp_path, fake, port, redis_url, redis_prefix))
        async with botd_run(cfg, port, tmp_path) as botd:
            await botd.wait_healthy()
            status, body = await botd.get("/readyz")
            assert status == 200, body
            assert json.loads(body)["checks"]["redis"] is True
            status, body = await botd.get("/metrics")
            assert status == 200
            assert "botd_runs_total" in body and "botd_event_loop_lag_seconds" in body
            assert await botd.terminate() == 0
        assert "botd.stopped" in botd.log()


async def test_run_on_embedded_defaults_starts_and_stops_its_own_valkey(tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        port = free_port()
        config = {
            "agent": {"workspace": str(tmp_path / "ws")},
            "llm": {"base_url": fake.base_url, "api_key": "test-key"},
            "http": {"port": port},
        }
        cfg = write_config(tmp_path / "botd.yaml", config)
        async with botd_run(cfg, port, tmp_path) as botd:
            await botd.wait_healthy()
            status, body = await botd.get("/readyz")
            assert status == 200, body
            assert (tmp_path / "ws" / ".botd" / "valkey.sock").exists()
            assert await botd.terminate() == 0
        assert not (tmp_path / "ws" / ".botd" / "valkey.sock").exists()


async def test_bad_config_value_exits_2_naming_the_key(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "botd.yaml", {"llm": {"max_retries": "lots"}})
    proc = await asyncio.create_subprocess_exec(
        *BOTD, "--config", str(cfg), "run", cwd=str(tmp_path), env=clean_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert "llm.max_retries" in err.decode()


async def test_chat_answers_on_the_terminal(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with FakeOpenAI() as fake:
        fake.script(Reply.text("Hello from **botd**."))
        cfg = write_config(tmp_path / "botd.yaml", base_config(tmp_path, fake, free_port(), redis_url, redis_prefix))
        proc = await asyncio.create_subprocess_exec(
            *BOTD, "--config", str(cfg), "chat", cwd=str(tmp_path), env=clean_env(),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(b"hi there\n"), 60)
        assert proc.returncode == 0, err.decode()[-3000:]
        assert "bot> Hello from **botd**." in out.decode()
        assert fake.requests and fake.requests[0]["messages"][-1]["content"].endswith("hi there")
