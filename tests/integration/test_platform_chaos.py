"""A chat platform failing at random, seeded: every API call a message and its reply make
(Telegram's ``getUpdates``, ``sendChatAction``, ``sendMessage``, edits, deletes,
reactions; Slack's ``chat.postMessage``, ``chat.update``, ``chat.delete``, reactions)
gets errors, rate limits, slow answers, connections dropped before or after the call
took effect, and unreadable answers. Whatever the draw:

- no answer shows twice;
- an answer that never shows is one whose send may have arrived (its connection dropped,
  or its answer could not be read) or one the chat was told about;
- every message is in its session's history once;
- once the platform behaves again, every chat is answered again, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from bot.daemon import Daemon
from bot.gateway.redelivery import UNDELIVERED_TEXT
from bot.session_keys import session_key
from channels.slack import SlackChannel, SlackSettings
from channels.telegram.adapter import TelegramChannel
from channels.telegram.settings import TelegramSettings
from tests.fakes.openai_server import FakeOpenAI, Reply, last_user_text_of
from tests.fakes.slack_server import FakeSlack, message_event
from tests.fakes.telegram_server import FakeTelegram
from tests.integration.files_rig import running
from tests.integration.gateway_harness import make_config, wait_until

pytestmark = pytest.mark.timeout(120)

CHATS = tuple(range(1, 9))
RATE = 0.25
HANG_S = 0.3


class Platform(Protocol):
    name: str

    def chaos(self, seed: int) -> None: ...
    def calm(self) -> None: ...
    def struck(self) -> bool: ...
    async def say(self, chat: int, text: str) -> None: ...
    def answers(self, chat: int, mark: str) -> int: ...
    def may_have_arrived(self, chat: int, mark: str) -> bool: ...
    def told(self, chat: int) -> bool: ...
    def session(self, chat: int) -> str: ...


def marked(text: str, mark: str) -> bool:
    return re.search(rf"\b{mark}\b", text) is not None


class Faulty:
    """What both fakes share: seeded chaos on the methods a reply uses, and calm."""

    METHODS: tuple[str, ...]
    KINDS: tuple[str, ...]
    fake: FakeTelegram | FakeSlack

    def chaos(self, seed: int) -> None:
        for n, method in enumerate(self.METHODS):
            self.fake.chaos(method, RATE, kinds=self.KINDS, seed=seed * 100 + n, hang_s=HANG_S)

    def calm(self) -> None:
        self.fake.calm()


class Telegram(Faulty):
    name = "telegram"
    METHODS = ("getUpdates", "sendChatAction", "sendMessage", "editMessageText", "deleteMessage",
               "setMessageReaction")
    KINDS = ("500", "502", "429", "timeout", "drop", "drop_after", "malformed")

    def __init__(self, fake: FakeTelegram) -> None:
        self.fake = fake

    @staticmethod
    def user(chat: int) -> int:
        return 7000 + chat

    def channel(self) -> TelegramChannel:
        return TelegramChannel(TelegramSettings(
            token=self.fake.token, api_base_url=self.fake.base_url, allow_from=tuple(str(self.user(c)) for c in CHATS),
            stream_edit_interval_s=0.3, lease_ttl_s=3.0, lease_renew_s=0.5, poll_timeout_s=1,
            poll_backoff_s=0.05, send_backoff_s=0.05, typing_interval_s=0.5, preview_timeout_s=1.0,
        ))

    def struck(self) -> bool:
        return any(c.status != 200 for c in self.fake.calls)

    async def say(self, chat: int, text: str) -> None:
        self.fake.push_message(self.fake.private_message(self.user(chat), text))

    def answers(self, chat: int, mark: str) -> int:
        return sum(marked(m.text, mark) for m in self.fake.sent_messages(self.user(chat)))

    def may_have_arrived(self, chat: int, mark: str) -> bool:
        # A dropped connection (status 0), or an "ok" answer with no message in it, which
        # says the message was made.
        return any(
            c.status in (0, 200) and str(c.params.get("chat_id")) == str(self.user(chat))
            and marked(str(c.params.get("text", "")), mark)
            for c in self.fake.calls_to("sendMessage")
        )

    def told(self, chat: int) -> bool:
        return any(m.text == UNDELIVERED_TEXT for m in self.fake.sent_messages(self.user(chat)))

    def session(self, chat: int) -> str:
        return session_key("main", "telegram", "dm", str(self.user(chat)))


class Slack(Faulty):
    name = "slack"
    METHODS = ("chat.postMessage", "chat.update", "chat.delete", "reactions.add", "reactions.remove")
    KINDS = ("500", "503", "timeout", "drop", "drop_after", "malformed", "ratelimited", "message_not_found")

    def __init__(self, fake: FakeSlack) -> None:
        self.fake = fake
        self._ts = 100

    @staticmethod
    def user(chat: int) -> str:
        return f"U{chat}"

    @staticmethod
    def dm(chat: int) -> str:
        return f"D{chat}"

    def channel(self) -> SlackChannel:
        return SlackChannel(SlackSettings(
            bot_token=self.fake.bot_token, app_token=self.fake.app_token, mode="socket",
            api_base_url=self.fake.api_url, allow_from=tuple(self.user(c) for c in CHATS), api_timeout_s=5.0,
        ))

    def struck(self) -> bool:
        return any(c.fault for c in self.fake.calls)

    async def say(self, chat: int, text: str) -> None:
        self._ts += 1
        await self.fake.push_event(message_event(text, channel=self.dm(chat), user=self.user(chat),
                                                 ts=f"{self._ts}.1", channel_type="im"))

    def _texts(self, chat: int) -> list[str]:
        return [str(m.get("text") or "") for (channel, _), m in self.fake.messages.items()
                if channel == self.dm(chat) and m.get("user") == self.fake.bot_user_id]

    def answers(self, chat: int, mark: str) -> int:
        return sum(marked(text, mark) for text in self._texts(chat))

    def may_have_arrived(self, chat: int, mark: str) -> bool:
        return any(
            c.fault in ("drop", "drop_after", "malformed") and c.args.get("channel") == self.dm(chat)
            and marked(str(c.args.get("text", "")), mark)
            for c in self.fake.calls_to("chat.postMessage")
        )

    def told(self, chat: int) -> bool:
        return any(UNDELIVERED_TEXT in text for text in self._texts(chat))

    def session(self, chat: int) -> str:
        return session_key("main", "slack", "dm", self.user(chat))


def answer(body: dict[str, Any]) -> Reply:
    return Reply.text("ack " + " ".join(re.findall(r"\bmk\w+", last_user_text_of(body))))


@contextlib.asynccontextmanager
async def platform_daemon(name: str, tmp_path: Path, llm: FakeOpenAI, redis_url: str,
                          redis_prefix: str) -> AsyncIterator[tuple[Platform, Daemon]]:
    cfg = make_config(tmp_path, llm, redis_url, redis_prefix, queue={"debounce_ms": 0})
    if name == "telegram":
        async with FakeTelegram() as tg:
            telegram = Telegram(tg)
            async with running(cfg, name, telegram.channel()) as daemon:
                yield telegram, daemon
    else:
        async with FakeSlack() as fake:
            slack = Slack(fake)
            async with running(cfg, name, slack.channel()) as daemon:
                await fake.wait_connected()
                yield slack, daemon


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("name", ["telegram", "slack"])
async def test_random_platform_faults_never_show_an_answer_twice_nor_lose_one_silently(
    tmp_path: Path, redis_url: str, redis_prefix: str, name: str, seed: int
) -> None:
    async with FakeOpenAI(responder=answer) as llm, platform_daemon(name, tmp_path, llm, redis_url,
                                                                     redis_prefix) as (chat, daemon):
        assert daemon.app is not None
        chat.chaos(seed)
        for n in CHATS:
            await chat.say(n, f"hello mk{n}a")

        def unsettled() -> list[int]:
            return [n for n in CHATS
                    if not (chat.answers(n, f"mk{n}a") or chat.may_have_arrived(n, f"mk{n}a") or chat.told(n))]

        with contextlib.suppress(AssertionError):
            await wait_until(lambda: not unsettled(), timeout=60, what="every chat answered or accounted for")
        assert not unsettled(), "neither answered nor accounted for"
        await asyncio.sleep(1.0)  # nothing more may show (a late resend)
        for n in CHATS:
            assert chat.answers(n, f"mk{n}a") <= 1, n
        assert chat.struck(), "the chaos never struck"

        chat.calm()
        for n in CHATS:
            await chat.say(n, f"again mk{n}b")
        await wait_until(lambda: all(chat.answers(n, f"mk{n}b") for n in CHATS), timeout=30,
                         what="every chat answered once the platform is back")
        await asyncio.sleep(0.5)
        for n in CHATS:
            assert chat.answers(n, f"mk{n}a") <= 1, n
            assert chat.answers(n, f"mk{n}b") == 1, n
            said = [m.content or "" for m in await daemon.app.sessions.history(chat.session(n)) if m.role == "user"]
            assert sum(f"mk{n}a" in text for text in said) == 1, said
            assert sum(f"mk{n}b" in text for text in said) == 1, said
