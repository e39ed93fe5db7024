"""``botd doctor`` against the fakes: each misconfiguration gives its line, its fix and its exit code."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.botd_process import free_port, write_config
from tests.e2e.cli_rig import TELEGRAM_TOKEN, assert_no_traceback, botd
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram

pytestmark = pytest.mark.e2e


@dataclass
class Fakes:
    llm: FakeOpenAI
    telegram: FakeTelegram
    slack: FakeSlack


@pytest.fixture
async def fakes() -> AsyncIterator[Fakes]:
    async with FakeOpenAI(serve_models=False) as llm, FakeTelegram(TELEGRAM_TOKEN) as tg, FakeSlack() as slack:
        yield Fakes(llm, tg, slack)


def good_config(tmp_path: Path, f: Fakes, redis_url: str, prefix: str) -> dict[str, Any]:
    return {
        "agent": {"workspace": str(tmp_path / "ws")},
        "llm": {"base_url": f.llm.base_url, "api_key": "test-key"},
        "redis": {"url": redis_url, "prefix": prefix},
        "http": {"port": free_port()},
        "telegram": {"enabled": True, "token": TELEGRAM_TOKEN, "api_base_url": f.telegram.base_url,
                     "dm_policy": "allowlist", "allow_from": ["42"]},
        "slack": {"enabled": True, "bot_token": f.slack.bot_token, "app_token": f.slack.app_token,
                  "api_base_url": f.slack.api_url, "allow_from": ["U1"]},
    }


async def doctor(tmp_path: Path, config: dict[str, Any]) -> Any:
    path = write_config(tmp_path / "botd.yaml", config)
    result = await botd("doctor", "--config", str(path), cwd=tmp_path)
    assert_no_traceback(result)
    return result


def line(result: Any, name: str) -> str:
    found = [ln for ln in result.out.splitlines() if f"  {name}: " in ln]
    assert found, result.text
    return "\n".join(found)


async def test_all_good_with_an_llm_that_has_no_models_route(
    tmp_path: Path, fakes: Fakes, redis_url: str, redis_prefix: str
) -> None:
    result = await doctor(tmp_path, good_config(tmp_path, fakes, redis_url, redis_prefix))
    assert result.rc == 0, result.text
    assert "one-token completion" in line(result, "llm") and "HTTP 404" in line(result, "llm")
    assert fakes.llm.requests[-1]["max_tokens"] == 1
    assert line(result, "telegram").startswith("ok") and "@botd_test_bot" in line(result, "telegram")
    assert line(result, "slack").startswith("ok")
    assert line(result, "heartbeat").startswith("off")
    assert "All checks passed." in result.out


async def test_unreachable_llm_names_the_url_and_the_cause(
    tmp_path: Path, fakes: Fakes, redis_url: str, redis_prefix: str
) -> None:
    config = good_config(tmp_path, fakes, redis_url, redis_prefix)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    config["llm"]["base_url"] = dead
    result = await doctor(tmp_path, config)
    assert result.rc == 1
    llm = line(result, "llm")
    assert llm.startswith("FAIL") and f"{dead}/models" in llm and "connection refused" in llm
    assert "Fix: check llm.base_url" in llm


async def test_rejected_api_key(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with FakeOpenAI(api_key="right-key") as llm:
        config = {"agent": {"workspace": str(tmp_path / "ws")}, "redis": {"url": redis_url, "prefix": redis_prefix},
                  "llm": {"base_url": llm.base_url, "api_key": "wrong-key"}}
        result = await doctor(tmp_path, config)
    assert result.rc == 1
    assert "API key was refused" in line(result, "llm") and "wrong-key" not in result.text


async def test_disabled_channels_are_listed(tmp_path: Path, fakes: Fakes, redis_url: str, redis_prefix: str) -> None:
    config = good_config(tmp_path, fakes, redis_url, redis_prefix)
    config["telegram"] = {"enabled": False}
    config["slack"] = {"enabled": False}
    result = await doctor(tmp_path, config)
    assert result.rc == 0, result.text
    assert line(result, "telegram").startswith("off") and line(result, "slack").startswith("off")


@pytest.mark.parametrize(
    ("section", "change", "expected"),
    [
        ("telegram", {"token": "123:garbage"}, "does not look like a bot token"),
        ("slack", {"bot_token": "xapp-fake-app-token", "app_token": "xoxb-fake-bot-token"}, "swapped"),
        ("slack", {"app_token": "xoxb-another"}, "slack.app_token is a bot token"),
        ("slack", {"bot_token": "xoxp-user-token"}, "does not start with xoxb-"),
    ],
)
async def test_token_shapes_fail_with_a_fix(
    tmp_path: Path, fakes: Fakes, redis_url: str, redis_prefix: str,
    section: str, change: dict[str, str], expected: str,
) -> None:
    config = good_config(tmp_path, fakes, redis_url, redis_prefix)
    config[section].update(change)
    result = await doctor(tmp_path, config)
    assert result.rc == 1, result.text
    found = line(result, section)
    assert found.startswith("FAIL") and expected in found and "Fix: " in found
    for secret in change.values():
        assert secret not in result.text


async def test_token_the_platform_rejects(tmp_path: Path, fakes: Fakes, redis_url: str, redis_prefix: str) -> None:
    config = good_config(tmp_path, fakes, redis_url, redis_prefix)
    config["telegram"]["token"] = "987654321:" + "B" * 35  # right shape, unknown to the fake
    result = await doctor(tmp_path, config)
    assert result.rc == 1
    assert "rejected the token" in line(result, "telegram") and "B" * 35 not in result.text


async def test_warnings_do_not_fail(tmp_path: Path, fakes: Fakes, redis_url: str, redis_prefix: str) -> None:
    config = good_config(tmp_path, fakes, redis_url, redis_prefix)
    config["telegram"]["allow_from"] = []
    config["heartbeat"] = {"enabled": True}
    result = await doctor(tmp_path, config)
    assert result.rc == 0, result.text
    telegram = line(result, "telegram")
    assert "warn  telegram: telegram.allow_from is empty" in telegram and "dm_policy: pairing" in telegram
    assert line(result, "heartbeat").startswith("warn") and "heartbeat.target" in line(result, "heartbeat")
    assert "Passed, with warnings." in result.out


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"llm": {"model": "m"}}, "llm.api_key"),
        ({"security": {"cli_tools_file": "tools.yaml"}}, "security.cli_tools_file"),
        ({"telegram": {"enabled": True, "token": "no-colon"}}, "telegram.token"),
    ],
)
async def test_config_errors_exit_2_like_run(
    tmp_path: Path, redis_url: str, redis_prefix: str, change: dict[str, Any], key: str
) -> None:
    (tmp_path / "tools.yaml").write_text("tools:\n  - name: x\n    description: d\n    args: ['{{nope}}']\n")
    config = {"agent": {"workspace": str(tmp_path / "ws")}, "redis": {"url": redis_url, "prefix": redis_prefix},
              "llm": {"api_key": "k", "base_url": "http://127.0.0.1:9/v1"}, "http": {"port": free_port()}}
    for section, values in change.items():
        config.setdefault(section, {}).update(values)
    if key == "llm.api_key":
        config["llm"] = {"model": "m"}
    path = write_config(tmp_path / "botd.yaml", config)
    checked = await botd("doctor", "--config", str(path), cwd=tmp_path)
    run = await botd("run", "--config", str(path), cwd=tmp_path)
    assert (checked.rc, run.rc) == (2, 2), checked.text + run.text
    assert key in checked.err and key in run.err
    assert checked.err.strip().splitlines()[-1] == run.err.strip().splitlines()[-1]
    assert_no_traceback(checked)
    assert_no_traceback(run)
