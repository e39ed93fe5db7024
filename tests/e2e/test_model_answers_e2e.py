"""Cut, empty and odd model answers end to end: ``botd run`` with Telegram (webhook) and
the fake model, asserting what the Telegram chat shows and what the session stores.

One botd serves the module; every test talks in its own private chat with its own
marker word (``mk…``), and the fake model answers by marker (``ack <marks>`` unless a
test scripted otherwise), so the tests share no session and no order.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from agent import notices
from bot.store.keys import Keys
from bot.store.sessions import SessionStore
from tests.e2e.botd_process import BotdProcess, botd_run, free_port, write_config
from tests.e2e.chat_rig import (
    MarkerLLM,
    Ports,
    channel_sections,
    count_mark,
    eventually,
    post_telegram,
    telegram_dm_update,
    telegram_texts,
)
from tests.fakes.openai_server import Call, Reply
from tests.fakes.telegram_server import FakeTelegram

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

USERS = {"cut": 7101, "cutcall": 7102, "empty": 7103, "length": 7104, "auth": 7105, "first": 7106, "filter": 7107}


@dataclass
class Rig:
    tmp: Path
    llm: MarkerLLM
    tg: FakeTelegram
    bot: BotdProcess
    http: aiohttp.ClientSession
    redis: aioredis.Redis
    prefix: str

    async def say(self, user: int, text: str) -> None:
        assert await post_telegram(self.http, self.bot.url, telegram_dm_update(self.tg, user, text)) == 200

    async def history(self, user: int) -> list[tuple[str, str | None]]:
        messages = await SessionStore(self.redis, Keys(self.prefix)).history(f"agent:main:telegram:dm:{user}")
        return [(m.role, m.content) for m in messages]

    async def finished(self, user: int, what: str) -> None:
        """Wait for the run of ``user``'s chat to be over (the daemon logs it)."""
        key = f"agent:main:telegram:dm:{user}"
        await eventually(lambda: '"run.finished"' in self.bot.log() and key in _finished_keys(self.bot.log()), 20,
                         f"{what}\n{self.bot.log()[-3000:]}")


def _finished_keys(log: str) -> str:
    return "\n".join(line for line in log.splitlines() if '"run.finished"' in line)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> AsyncIterator[Rig]:
    tmp = tmp_path_factory.mktemp("answers")
    prefix = f"e2eans{uuid.uuid4().hex[:6]}"
    llm = MarkerLLM()
    async with llm, FakeTelegram() as tg, aiohttp.ClientSession() as http:
        port = free_port()
        config: dict[str, Any] = {
            "agent": {"workspace": str(tmp / "ws")},
            "llm": {"base_url": llm.base_url, "api_key": "test-key", "max_retries": 2, "request_timeout_s": 20},
            "redis": {"url": redis_url, "prefix": prefix},
            "http": {"port": port},
            "queue": {"mode": "followup", "debounce_ms": 0},
            "gateway": {"shutdown_grace_s": 2},
            "log": {"level": "info"},
            **channel_sections(Ports(llm=llm, tg=tg, tg_users=list(USERS.values())),
                               webhook_url=f"http://127.0.0.1:{port}/telegram"),
        }
        path = write_config(tmp / "botd.yaml", config)
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            async with botd_run(path, port, tmp) as bot:
                await bot.wait_healthy(60)
                yield Rig(tmp, llm, tg, bot, http, client, prefix)
                assert await bot.terminate() == 0, bot.log()[-3000:]
        finally:
            await client.aclose()


async def test_a_cut_answer_ends_in_a_notice_and_is_not_stored(rig: Rig) -> None:
    user = USERS["cut"]
    rig.llm.script_for("mkcut1", Reply.truncated(4, text="Hello! This answer is cut", chunk_delay_s=0.3))
    await rig.say(user, "mkcut1 tell me")
    await rig.finished(user, "the cut run")
    [notice] = telegram_texts(rig.tg, user)  # the partial preview is gone
    assert notice.startswith(notices.FAILURE_PREFIX) and "midway" in notice
    assert await rig.history(user) == [("user", "mkcut1 tell me")]
    assert len(rig.llm.requests_with("mkcut1")) == 1


async def test_a_file_write_from_a_cut_stream_never_happens(rig: Rig) -> None:
    user = USERS["cutcall"]
    write = Call("write_file", {"path": "pwned.txt", "content": "x"}, id="w1")
    rig.llm.script_for("mkcutcall1", Reply.tool_calls([write], args_as="whole", cut_after=2))
    await rig.say(user, "mkcutcall1 save it")
    await eventually(lambda: count_mark(telegram_texts(rig.tg, user), "mkcutcall1") == 1, 20, "the answer")
    await rig.finished(user, "the retried run")  # its run ended, its messages recorded
    assert not (rig.tmp / "ws" / "pwned.txt").exists()
    assert telegram_texts(rig.tg, user) == ["ack mkcutcall1"]
    assert await rig.history(user) == [("user", "mkcutcall1 save it"), ("assistant", "ack mkcutcall1")]
    assert len(rig.llm.requests_with("mkcutcall1")) == 2  # nothing had reached the chat: retried once


async def test_no_answer_twice_is_told_never_silent(rig: Rig) -> None:
    user = USERS["empty"]
    rig.llm.script_for("mkempty1", Reply.html(), Reply.text("", reasoning="only thinking"))
    await rig.say(user, "mkempty1 hello?")
    await rig.finished(user, "the empty run")
    [notice] = telegram_texts(rig.tg, user)
    assert notice.startswith(notices.FAILURE_PREFIX) and "answered with nothing" in notice
    assert await rig.history(user) == [("user", "mkempty1 hello?")]
    assert len(rig.llm.requests_with("mkempty1")) == 2


@pytest.mark.parametrize(("who", "reason", "notice"), [("length", "length", notices.LENGTH),
                                                        ("filter", "content_filter", notices.CONTENT_FILTER)])
async def test_an_answer_stopped_early_comes_with_its_notice(rig: Rig, who: str, reason: str, notice: str) -> None:
    user, mark = USERS[who], f"mk{who}1"
    rig.llm.script_for(mark, Reply.text(f"The first half {mark}", finish_reason=reason))
    await rig.say(user, f"{mark} explain")
    await rig.finished(user, "the cut-short run")
    [text] = telegram_texts(rig.tg, user)
    assert text.startswith(f"The first half {mark}") and text.endswith(notice)
    assert await rig.history(user) == [("user", f"{mark} explain"), ("assistant", f"The first half {mark}")]


async def test_a_credentials_failure_tells_the_user_without_operator_detail(rig: Rig) -> None:
    user = USERS["auth"]
    rig.llm.script_for("mkauth1", Reply.error(401, message="Incorrect API key provided."))
    await rig.say(user, "mkauth1 hi")
    await rig.finished(user, "the failed run")
    [notice] = telegram_texts(rig.tg, user)
    assert notices.OPERATOR_TOLD in notice
    assert "api_key" not in notice and "401" not in notice
    assert "check llm.api_key" in rig.bot.log()  # the operator's detail is in the log


async def test_an_error_event_before_the_first_chunk_is_retried(rig: Rig) -> None:
    user = USERS["first"]
    rig.llm.script_for("mkfirst1", Reply.stream_error(after_chunks=0), Reply.disconnect(after_chunks=0))
    await rig.say(user, "mkfirst1 hi")
    await eventually(lambda: count_mark(telegram_texts(rig.tg, user), "mkfirst1") == 1, 20, "the answer")
    assert telegram_texts(rig.tg, user) == ["ack mkfirst1"]
    assert len(rig.llm.requests_with("mkfirst1")) == 3
