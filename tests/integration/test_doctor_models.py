"""``botd doctor`` checks every model a chat may switch to, not only the default."""

from __future__ import annotations

import socket
from pathlib import Path

from bot.config import BotdConfig
from bot.doctor import run_checks
from tests.fakes.openai_server import FakeOpenAI


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_each_listed_model_is_checked_on_its_own_endpoint(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as fake, FakeOpenAI(api_key="other-key") as other:
        cfg = BotdConfig.model_validate({
            "agent": {"workspace": str(tmp_path / "ws")},
            "redis": {"url": redis_url, "prefix": redis_prefix},
            "llm": {
                "model": "small", "base_url": fake.base_url, "api_key": "k",
                "models": {
                    "small": {"context_window": 16000},
                    "elsewhere": {"base_url": other.base_url, "api_key": "other-key"},
                    "gone": {"base_url": f"http://127.0.0.1:{closed_port()}/v1"},
                },
            },
        })
        checks = {f.name: f for f in await run_checks(cfg)}
    assert checks["llm"].status == "ok" and "model small" in checks["llm"].detail
    assert "llm small" not in checks  # the default is checked once
    assert checks["llm elsewhere"].status == "ok", checks["llm elsewhere"]
    assert checks["llm gone"].status == "FAIL" and checks["llm gone"].fix
