"""``botd run`` that cannot start says so in one line naming the key and the fix, exits 2
for configuration and 1 for the environment, and leaves nothing running (its embedded
Valkey is stopped)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from bot.store.embedded import EmbeddedPaths
from bot.store.valkey_process import probe
from tests.e2e.botd_process import BOTD, clean_env, free_port, write_config
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def base_config(tmp: Path, port: int) -> dict[str, Any]:
    return {
        "agent": {"workspace": str(tmp / "ws")},
        "llm": {"base_url": "http://127.0.0.1:9/v1", "api_key": "test-key"},
        "http": {"port": port},
        "log": {"level": "info"},
    }


def telegram_section(tg: FakeTelegram, token: str | None = None) -> dict[str, Any]:
    return {"telegram": {"enabled": True, "token": token or tg.token, "api_base_url": tg.base_url,
                         "mode": "polling", "allow_from": ["42"]}}


async def botd_exits(tmp: Path, config: dict[str, Any]) -> tuple[int, str]:
    path = write_config(tmp / "botd.yaml", config)
    proc = await asyncio.create_subprocess_exec(
        *BOTD, "--config", str(path), "run", cwd=str(tmp), env=clean_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError("botd kept running") from None
    assert proc.returncode is not None
    return proc.returncode, err.decode(errors="replace")


def assert_one_clear_line(stderr: str, *needles: str) -> None:
    assert "Traceback" not in stderr, stderr
    [line] = [ln for ln in stderr.splitlines() if ln.startswith("botd:")]
    for needle in needles:
        assert needle in line, line


def assert_nothing_left_running(tmp: Path) -> None:
    assert probe(EmbeddedPaths.for_workspace(tmp / "ws").socket) is None, "the embedded Valkey was left running"


async def test_a_rejected_telegram_token_exits_2_naming_the_key(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        config = {**base_config(tmp_path, free_port()), **telegram_section(tg, "999:AAwrongTokenForTheTest_abcdefgh")}
        code, err = await botd_exits(tmp_path, config)
    assert code == 2, err
    assert_one_clear_line(err, "telegram.token")
    assert "AAwrongToken" not in err
    assert_nothing_left_running(tmp_path)


async def test_an_unreadable_get_me_exits_1_naming_the_url_key(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        tg.malformed_next("getMe", {"ok": True, "result": {"is_bot": True}}, times=10)
        code, err = await botd_exits(tmp_path, {**base_config(tmp_path, free_port()), **telegram_section(tg)})
    assert code == 1, err
    assert_one_clear_line(err, "telegram.api_base_url")
    assert_nothing_left_running(tmp_path)


async def test_a_refused_slack_token_exits_2_naming_the_key(tmp_path: Path) -> None:
    async with FakeSlack() as slack:
        config = {
            **base_config(tmp_path, free_port()),
            "slack": {"enabled": True, "mode": "http", "bot_token": "xoxb-not-the-right-one",
                      "signing_secret": slack.signing_secret, "api_base_url": slack.api_url, "allow_from": ["U1"]},
        }
        code, err = await botd_exits(tmp_path, config)
    assert code == 2, err
    assert_one_clear_line(err, "slack.bot_token")
    assert "xoxb-not-the-right-one" not in err
    assert_nothing_left_running(tmp_path)


async def test_an_http_port_in_use_exits_1_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with FakeTelegram() as tg:
            code, err = await botd_exits(tmp_path, {**base_config(tmp_path, port), **telegram_section(tg)})
    assert code == 1, err
    assert_one_clear_line(err, str(port))
    assert_nothing_left_running(tmp_path)


async def test_an_unreachable_bot_api_exits_1_after_a_bounded_try(tmp_path: Path) -> None:
    closed = free_port()  # nothing listens there: every connection is refused
    config = {
        **base_config(tmp_path, free_port()),
        "telegram": {"enabled": True, "token": "123456:AAunreachableTokenForTheTest_abcd",
                     "api_base_url": f"http://127.0.0.1:{closed}/bot", "allow_from": ["42"]},
    }
    code, err = await botd_exits(tmp_path, config)
    assert code == 1, err
    assert_one_clear_line(err, "telegram.api_base_url", "network", f"127.0.0.1:{closed}")
    assert "AAunreachableToken" not in err
    assert err.count("telegram.connect_failed") == 2  # the attempts before giving up, logged
    assert_nothing_left_running(tmp_path)


async def test_a_refused_set_webhook_exits_2_naming_the_webhook_url(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        tg.fail_next("setWebhook", description="Bad Request: bad webhook: HTTPS url must be provided", times=5)
        section = telegram_section(tg)
        section["telegram"].update(mode="webhook", webhook_url="http://bot.example.com/telegram")
        code, err = await botd_exits(tmp_path, {**base_config(tmp_path, free_port()), **section})
        assert len(tg.calls_to("setWebhook")) == 1  # an answer, not an outage: never retried
    assert code == 2, err
    assert_one_clear_line(err, "telegram.webhook_url", "url must be provided")
    assert_nothing_left_running(tmp_path)
