"""``botd init --non-interactive`` against the fakes: tests every answer live, then writes ~/.botd/botd.yaml."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from bot.config import load_config
from tests.e2e.botd_process import free_port
from tests.e2e.cli_rig import TELEGRAM_TOKEN, assert_no_traceback, botd
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram

pytestmark = pytest.mark.e2e


def home_config() -> Path:
    return Path(os.environ["HOME"]) / ".botd" / "botd.yaml"


async def test_writes_a_private_commented_config_that_loads(tmp_path: Path) -> None:
    async with FakeOpenAI(serve_models=False) as llm, FakeTelegram(TELEGRAM_TOKEN) as tg, FakeSlack() as slack:
        result = await botd(
            "init", "--non-interactive", "--llm-base-url", llm.base_url, "--llm-api-key", "k-123",
            "--llm-model", "gpt-4o-mini", "--telegram-token", TELEGRAM_TOKEN,
            "--slack-bot-token", slack.bot_token, "--slack-app-token", slack.app_token,
            cwd=tmp_path, BOTD_TELEGRAM__API_BASE_URL=tg.base_url, BOTD_SLACK__API_BASE_URL=slack.api_url,
        )
        assert result.rc == 0, result.text
        assert llm.requests and llm.requests[-1]["max_tokens"] == 1  # the live one-token test
    assert "@botd_test_bot" in result.out and "Next: botd run" in result.out
    assert "botd pairing approve" in result.out
    path = home_config()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# botd configuration") and "dm_policy: pairing" in text
    cfg = load_config(path)
    assert cfg.telegram.enabled and cfg.slack.enabled and cfg.slack.mode == "socket"
    assert cfg.telegram.dm_policy == "pairing" and cfg.slack.dm_policy == "pairing"
    assert cfg.llm.base_url == llm.base_url and cfg.llm.api_key is not None
    assert cfg.workspace == Path(os.environ["HOME"]) / ".botd" / "workspace"
    assert cfg.workspace.is_dir()


async def test_the_written_config_is_found_from_any_directory(tmp_path: Path) -> None:
    async with FakeOpenAI() as llm:
        written = await botd("init", "--non-interactive", "--llm-base-url", llm.base_url, "--dm-policy",
                             "allowlist", "--allow-from", "42, 43", cwd=tmp_path)
    assert written.rc == 0, written.text
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = await botd("status", "--verbose", cwd=elsewhere)
    assert f"config: {home_config()}" in shown.text
    assert not (elsewhere / "workspace").exists() and not (elsewhere / "botd.yaml").exists()
    cfg = yaml.safe_load(home_config().read_text(encoding="utf-8"))
    assert cfg["telegram"]["allow_from"] == ["42", "43"] and cfg["telegram"]["enabled"] is False
    assert "api_key" not in cfg["llm"]  # nothing given: the key stays in the environment


async def test_the_questions_retry_a_failed_answer_and_write_the_config(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    async with FakeOpenAI(serve_models=False) as llm, FakeTelegram(TELEGRAM_TOKEN) as tg:
        answers = "\n".join([
            dead, "k-1", "",            # LLM: unreachable at first
            "y",                        # try again
            llm.base_url, "k-1", "",    # now the fake
            "y", "12:bad", "y",         # Telegram: a malformed token, try again
            TELEGRAM_TOKEN,
            "n",                        # no Slack
            "allowlist", "42",
        ]) + "\n"
        result = await botd("init", cwd=tmp_path, answers=answers, BOTD_TELEGRAM__API_BASE_URL=tg.base_url)
    assert result.rc == 0, result.text
    assert "connection refused" in result.out and "does not look like a bot token" in result.out
    assert "token accepted for @botd_test_bot" in result.out
    cfg = load_config(home_config())
    assert cfg.llm.base_url == llm.base_url and cfg.telegram.enabled and not cfg.slack.enabled
    assert cfg.telegram.dm_policy == "allowlist" and cfg.telegram.allow_from == ["42"]


async def test_questions_cut_short_write_nothing(tmp_path: Path) -> None:
    result = await botd("init", cwd=tmp_path, answers="http://127.0.0.1:9/v1\n")
    assert result.rc == 1 and "nothing written" in result.err
    assert_no_traceback(result)
    assert not home_config().exists()


async def test_an_existing_config_is_kept_without_force(tmp_path: Path) -> None:
    path = home_config()
    path.parent.mkdir(parents=True)
    path.write_text("agent: {id: mine}\n")
    result = await botd("init", "--non-interactive", "--skip-checks", "--llm-base-url", "http://x/v1", cwd=tmp_path)
    assert result.rc == 1 and "--force" in result.err
    assert path.read_text() == "agent: {id: mine}\n"
    forced = await botd("init", "--non-interactive", "--skip-checks", "--force", "--llm-base-url", "http://x/v1",
                        cwd=tmp_path)
    assert forced.rc == 0, forced.text
    assert "mine" not in path.read_text()


async def test_a_failed_check_writes_nothing(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    result = await botd("init", "--non-interactive", "--llm-base-url", dead, cwd=tmp_path)
    assert result.rc == 1
    assert f"{dead}/models" in result.out and "connection refused" in result.out
    assert "nothing written" in result.err
    assert_no_traceback(result)
    assert not home_config().exists()


async def test_a_garbage_telegram_token_is_refused_before_any_request(tmp_path: Path) -> None:
    async with FakeOpenAI() as llm, FakeTelegram(TELEGRAM_TOKEN) as tg:
        result = await botd("init", "--non-interactive", "--llm-base-url", llm.base_url,
                            "--telegram-token", "12345:short", cwd=tmp_path,
                            BOTD_TELEGRAM__API_BASE_URL=tg.base_url)
        assert not tg.calls
    assert result.rc == 1 and "does not look like a bot token" in result.out
    assert "12345:short" not in result.text
    assert not home_config().exists()


async def test_init_writes_where_config_points(tmp_path: Path) -> None:
    target = tmp_path / "conf" / "botd.yaml"
    result = await botd("init", "--non-interactive", "--skip-checks", "--config", str(target),
                        "--llm-api-key", "k", cwd=tmp_path)
    assert result.rc == 0, result.text
    assert target.is_file() and f"--config {target}" in result.out
    assert not home_config().exists()
