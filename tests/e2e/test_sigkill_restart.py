"""``botd run`` SIGKILLed mid-stream and started again: the retried run finalizes or
removes the dead attempt's preview, so each chat ends with the answer once and no
stale partial (Telegram and Slack alike)."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.botd_process import BotdProcess, botd_run, free_port, write_config
from tests.e2e.chat_rig import (
    MarkerLLM,
    Ports,
    channel_sections,
    eventually,
    post_slack,
    post_telegram,
    slack_dm_body,
    slack_texts,
    telegram_dm_update,
    telegram_texts,
)
from tests.fakes.openai_server import Reply
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

LOCK_TTL_S = 4.0
TG_USER = 5301
SLACK_USER = "UKILLED"


async def ready(bot: BotdProcess) -> None:
    await bot.wait_healthy(60)
    for _ in range(300):
        status, _ = await bot.get("/readyz")
        if status == 200:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"botd never became ready\n{bot.log()[-3000:]}")


async def test_sigkill_mid_stream_then_restart_leaves_the_answer_once_and_no_stale_preview(
    tmp_path: Path, redis_url: str
) -> None:
    tg_final = "Telegram mkkilltg: " + " ".join(f"word{i}" for i in range(60))
    slack_final = "Slack mkkillsl: " + " ".join(f"word{i}" for i in range(60))
    llm = MarkerLLM()
    # The first attempts stream slowly (botd dies during them); the retries stream fast.
    llm.script_for("mkkilltg", Reply.text(tg_final, chunk_chars=4, chunk_delay_s=0.1), Reply.text(tg_final))
    llm.script_for("mkkillsl", Reply.text(slack_final, chunk_chars=4, chunk_delay_s=0.1), Reply.text(slack_final))
    async with llm, FakeTelegram() as tg, FakeSlack() as slack, aiohttp.ClientSession() as http:
        port = free_port()
        ports = Ports(llm=llm, slack=slack, tg=tg, slack_users=[SLACK_USER], tg_users=[TG_USER])
        config = {
            "agent": {"workspace": str(tmp_path / "ws")},
            "llm": {"base_url": llm.base_url, "api_key": "test-key"},
            "redis": {"url": redis_url, "prefix": f"e2ekill{uuid.uuid4().hex[:6]}"},
            "http": {"port": port},
            "queue": {"mode": "followup", "debounce_ms": 0},
            "gateway": {"lock_ttl_s": LOCK_TTL_S, "shutdown_grace_s": 2},
            "telegram": {"stream_edit_interval_s": 0.3},
            "log": {"level": "info"},
        }
        for name, section in channel_sections(ports, webhook_url=f"http://127.0.0.1:{port}/telegram").items():
            config[name] = {**config.get(name, {}), **section}
        path = write_config(tmp_path / "botd.yaml", config)

        async with botd_run(path, port, tmp_path) as first:
            await ready(first)
            assert await post_telegram(http, first.url, telegram_dm_update(tg, TG_USER, "sskilltg mkkilltg go")) == 200
            assert await post_slack(http, first.url, slack, slack_dm_body(slack, SLACK_USER, "sskillsl mkkillsl go")) \
                == 200
            # Mid-stream: both chats show a partial preview, then the process dies.
            await eventually(lambda: bool(telegram_texts(tg, TG_USER)) and bool(slack_texts(slack, f"D{SLACK_USER}"))
                             and any(c.method == "editMessageText" for c in tg.calls), 20,
                             f"the previews\n{first.log()[-3000:]}")
            first.proc.send_signal(signal.SIGKILL)
            await first.proc.wait()
        [tg_partial] = telegram_texts(tg, TG_USER)
        assert tg_partial != tg_final

        async with botd_run(path, port, tmp_path) as second:
            await ready(second)
            await eventually(lambda: tg_final in telegram_texts(tg, TG_USER)
                             and slack_final in slack_texts(slack, f"D{SLACK_USER}"), LOCK_TTL_S + 30,
                             f"the answers after the restart\n{second.log()[-4000:]}")
            await asyncio.sleep(1.5)
            assert telegram_texts(tg, TG_USER) == [tg_final]
            assert slack_texts(slack, f"D{SLACK_USER}") == [slack_final]
            assert len(llm.requests_with("mkkilltg")) == 2 and len(llm.requests_with("mkkillsl")) == 2
            assert await second.terminate() == 0, second.log()[-3000:]
