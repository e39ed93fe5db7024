"""Telegram end to end: ``botd run`` as a subprocess against the fake Bot API and the fake LLM.

One botd process per mode serves the whole module: a polling one for most tests and a
webhook one for the webhook tests. Every test talks in its own private chat or group
with its own marker word, and the fake LLM answers by that marker, so the tests share
no session and do not depend on their order. A run is known to be over when the
daemon logs ``run.finished`` for its session key (JSON logs).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.e2e.botd_process import ECHO_TOOLS_YAML as TOOLS_YAML
from tests.e2e.botd_process import BotdProcess, botd_run, free_port, write_config
from tests.fakes.marker_router import Router, last_user_text
from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.fakes.telegram_server import FakeTelegram, SentMessage
from tests.fakes.telegram_updates import utf16_len

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

TOKEN = "123456:TEST-token-for-fake"
BOT_USERNAME = "botd_test_bot"
WEBHOOK_PATH = "/telegram"
WEBHOOK_SECRET = "e2e-webhook_secret-42"
AGENT = "agent:main:telegram"

# Private chats (the chat id is the user's id); each test has its own.
U_DM = 2001
U_BARRIER = 2002
U_DUP = 2003
U_STOP = 2004
U_STREAM = 2005
U_SILENT = 2006
U_LONG = 2007
U_FORMAT = 2008
U_PARSE = 2009
U_FLOOD = 2010
U_APPROVE = 2011
U_COMMANDS = 2012
U_GROUP = 2013  # talks in the groups
U_HOOK = 2014
U_CONTEXT = 2015
STRANGER = 6666  # not in allow_from

G_MENTION = -1001001
G_FORUM = -1001002
ALLOWED = [
    U_DM,
    U_BARRIER,
    U_DUP,
    U_STOP,
    U_STREAM,
    U_SILENT,
    U_LONG,
    U_FORMAT,
    U_PARSE,
    U_FLOOD,
    U_APPROVE,
    U_COMMANDS,
    U_GROUP,
    U_HOOK,
    U_CONTEXT,
]
GROUPS = [G_MENTION, G_FORUM]



async def eventually(predicate: Callable[[], bool], within: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def dm_key(user_id: int) -> str:
    return f"{AGENT}:dm:{user_id}"


def group_key(chat_id: int, topic: int | None = None) -> str:
    return f"{AGENT}:group:{chat_id}" + (f":topic:{topic}" if topic is not None else "")


# -- the fake model: replies chosen by a marker word in the last user message ------------


# -- one botd per mode ----------------------------------------------------------------------


@dataclass
class Bot:
    mode: str
    tg: FakeTelegram
    llm: FakeOpenAI
    router: Router
    botd: BotdProcess

    # inbound ---------------------------------------------------------------------------
    async def send(self, message: dict[str, Any], *, update_id: int | None = None) -> int:
        """Deliver a message update the way this mode does; returns its update_id."""
        update: dict[str, Any] = {"message": message}
        if update_id is not None:
            update = {"update_id": update_id, **update}
        if self.mode == "polling":
            return self.tg.push_update(update)
        if "update_id" not in update:
            update = {"update_id": self.next_update_id(), **update}
        status = await self.tg.deliver_webhook(update)
        assert status == 200, status
        return int(update["update_id"])

    def next_update_id(self) -> int:
        self.tg._next_update_id += 1
        return self.tg._next_update_id

    def dm(self, user_id: int, text: str) -> dict[str, Any]:
        return self.tg.private_message(user_id, text, first_name=f"U{user_id}")

    # outbound --------------------------------------------------------------------------
    def bot_messages(self, chat_id: int, *, include_deleted: bool = False) -> list[SentMessage]:
        return self.tg.sent_messages(chat_id, include_deleted=include_deleted)

    def texts(self, chat_id: int) -> list[str]:
        return [m.text for m in self.bot_messages(chat_id)]

    def calls(self, method: str, chat_id: int) -> list[Any]:
        return [c for c in self.tg.calls_to(method) if str(c.params.get("chat_id")) == str(chat_id)]

    def requests_for(self, marker: str) -> list[dict[str, Any]]:
        return [r for r in self.llm.requests if marker in last_user_text(r)]

    def log_events(self, event: str) -> list[dict[str, Any]]:
        out = []
        for line in self.botd.log().splitlines():
            if event not in line:
                continue
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == event:
                    out.append(record)
        return out

    async def dedupe_hits(self) -> float:
        """``botd_dedupe_hits_total{channel="telegram"}`` from /metrics."""
        status, body = await self.botd.get("/metrics")
        assert status == 200
        for line in body.splitlines():
            if line.startswith("botd_dedupe_hits_total{") and 'channel="telegram"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def runs_finished(self, session_key: str) -> list[dict[str, Any]]:
        return [r for r in self.log_events("run.finished") if r.get("session_key") == session_key]

    async def wait_runs(self, session_key: str, count: int = 1, within: float = 15.0) -> list[dict[str, Any]]:
        await eventually(
            lambda: len(self.runs_finished(session_key)) >= count,
            within,
            f"{count} finished run(s) of {session_key}\n{self.botd.log()[-3000:]}",
        )
        return self.runs_finished(session_key)

    async def wait_text(self, chat_id: int, needle: str, within: float = 10.0) -> SentMessage:
        def found() -> SentMessage | None:
            return next((m for m in self.bot_messages(chat_id) if needle in m.text), None)

        await eventually(
            lambda: found() is not None, within, f"{needle!r} in chat {chat_id}: {self.texts(chat_id)}"
        )
        message = found()
        assert message is not None
        return message


def botd_config(
    workdir: Path, mode: str, tg: FakeTelegram, llm: FakeOpenAI, redis_url: str
) -> dict[str, Any]:
    tools = workdir / "tools.yaml"
    tools.write_text(TOOLS_YAML, encoding="utf-8")
    port = free_port()
    telegram: dict[str, Any] = {
        "enabled": True,
        "token": TOKEN,
        "api_base_url": tg.base_url,
        "mode": mode,
        "allow_from": [str(u) for u in ALLOWED],
        "groups": [str(g) for g in GROUPS],
        "stream_edit_interval_s": 0.2,
    }
    if mode == "webhook":
        telegram.update(
            webhook_url=f"http://127.0.0.1:{port}{WEBHOOK_PATH}",
            webhook_secret=WEBHOOK_SECRET,
            webhook_path=WEBHOOK_PATH,
        )
    return {
        "agent": {"workspace": str(workdir / "ws")},
        "llm": {
            "base_url": llm.base_url, "api_key": "test-key", "max_retries": 0, "request_timeout_s": 30,
            "models": {"gpt-4o": {"context_window": 64000, "max_output_tokens": 2048,
                                  "price": {"prompt_per_mtok": 1.0, "completion_per_mtok": 2.0}}},
        },
        "redis": {"url": redis_url, "prefix": f"e2etg{mode}{uuid.uuid4().hex[:8]}"},
        "http": {"port": port},
        "telegram": telegram,
        "queue": {"debounce_ms": 0},
        "gateway": {"shutdown_grace_s": 2},
        "security": {"cli_tools_file": str(tools)},
        "log": {"level": "info"},
    }


@contextlib.asynccontextmanager
async def start_bot(mode: str, workdir: Path, redis_url: str) -> AsyncIterator[Bot]:
    router = Router()
    async with FakeTelegram(TOKEN, bot_username=BOT_USERNAME) as tg, FakeOpenAI(responder=router) as llm:
        config = botd_config(workdir, mode, tg, llm, redis_url)
        path = write_config(workdir / "botd.yaml", config)
        async with botd_run(path, config["http"]["port"], workdir) as botd:
            await botd.wait_healthy()
            ready: list[tuple[int, str]] = []

            async def is_ready() -> bool:
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    ready.append(await botd.get("/readyz"))
                    return ready[-1][0] == 200
                return False

            deadline = time.monotonic() + 20
            while not await is_ready():
                assert time.monotonic() < deadline, f"never ready: {ready[-1:]}\n{botd.log()[-3000:]}"
                await asyncio.sleep(0.1)
            if mode == "webhook":
                assert tg.webhook_url == config["telegram"]["webhook_url"]
                assert tg.webhook_secret == WEBHOOK_SECRET
            yield Bot(mode, tg, llm, router, botd)
            assert await botd.terminate() == 0, botd.log()[-3000:]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bot(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> AsyncIterator[Bot]:
    async with start_bot("polling", tmp_path_factory.mktemp("tg-polling"), redis_url) as polling:
        yield polling


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hook_bot(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> AsyncIterator[Bot]:
    async with start_bot("webhook", tmp_path_factory.mktemp("tg-webhook"), redis_url) as webhook:
        yield webhook


# -- private chats --------------------------------------------------------------------------


async def test_dm_is_answered_in_the_dm(bot: Bot) -> None:
    bot.router.on("case-dm", Reply.text("Hi there, in private."))
    await bot.send(bot.dm(U_DM, "hello case-dm"))
    await bot.wait_runs(dm_key(U_DM))

    assert bot.texts(U_DM) == ["Hi there, in private."]
    [request] = bot.requests_for("case-dm")
    assert last_user_text(request).endswith("hello case-dm")
    [message] = bot.bot_messages(U_DM)
    assert message.parse_mode == "HTML" and message.reply_to is None and message.thread_id is None
    assert bot.calls("sendChatAction", U_DM), "no typing indicator"


async def test_dm_from_a_stranger_costs_no_llm_call_and_gets_no_answer(bot: Bot) -> None:
    bot.router.on("case-barrier", Reply.text("Barrier answered."))
    await bot.send(bot.dm(STRANGER, "case-stranger let me in"))
    # Updates are handled in order: once the barrier is answered the stranger's was handled too.
    await bot.send(bot.dm(U_BARRIER, "case-barrier"))
    await bot.wait_text(U_BARRIER, "Barrier answered.")

    assert not bot.requests_for("case-stranger")
    assert bot.tg.sent_messages(STRANGER, include_deleted=True) == []
    assert bot.calls("sendChatAction", STRANGER) == []
    assert any(str(r.get("user_id")) == str(STRANGER) for r in bot.log_events("telegram.unauthorized"))


async def test_repeated_update_id_is_answered_once(bot: Bot) -> None:
    bot.router.on("case-dup", Reply.text("Answered once."))
    message = bot.dm(U_DUP, "case-dup")
    update_id = bot.next_update_id()
    hits = await bot.dedupe_hits()
    # Both copies are in the same getUpdates batch, as after a poller restart before its offset commit.
    await bot.send(message, update_id=update_id)
    await bot.send(message, update_id=update_id)
    await bot.wait_runs(dm_key(U_DUP))
    await asyncio.sleep(0.5)  # room for a second (wrong) run

    assert await bot.dedupe_hits() == hits + 1  # the copy did reach the daemon, and was dropped
    assert len(bot.requests_for("case-dup")) == 1
    assert len(bot.runs_finished(dm_key(U_DUP))) == 1
    assert bot.texts(U_DUP) == ["Answered once."]


async def test_stop_during_a_slow_stream_closes_it_and_says_stopped(bot: Bot) -> None:
    answer = " ".join(f"word{i}" for i in range(400))
    bot.router.on("case-stop", Reply.text(answer, chunk_chars=8, chunk_delay_s=0.05))
    disconnects = bot.llm.disconnects.count
    await bot.send(bot.dm(U_STOP, "case-stop write a long essay"))
    # The preview shows the stream is under way.
    await bot.wait_text(U_STOP, "word0")

    await bot.send(bot.dm(U_STOP, "/stop"))
    await bot.llm.disconnects.wait(disconnects + 1, timeout_s=10)
    [finished] = await bot.wait_runs(dm_key(U_STOP))
    await bot.wait_text(U_STOP, "Stopped.")
    await asyncio.sleep(0.5)  # a final answer, if one were coming, would be here by now

    assert finished["status"] == "cancelled"
    assert bot.texts(U_STOP) == ["Stopped."]  # the preview is gone, no answer came
    previews = [m for m in bot.bot_messages(U_STOP, include_deleted=True) if "word0" in m.text]
    assert previews and all(m.deleted for m in previews)
    sent = [
        c.params.get("text", "")
        for c in bot.calls("sendMessage", U_STOP) + bot.calls("editMessageText", U_STOP)
    ]
    assert not any("word399" in str(t) for t in sent)
    assert len(bot.requests_for("case-stop")) == 1


async def test_streaming_preview_is_sent_edited_then_finalized_as_html(bot: Bot) -> None:
    answer = "**Streaming** answer: " + " ".join(f"w{i}" for i in range(60))
    bot.router.on("case-stream", Reply.text(answer, chunk_chars=6, chunk_delay_s=0.03))
    await bot.send(bot.dm(U_STREAM, "case-stream go"))
    await bot.wait_runs(dm_key(U_STREAM))

    final_html = "<b>Streaming</b> answer: " + " ".join(f"w{i}" for i in range(60))
    [message] = bot.bot_messages(U_STREAM, include_deleted=True)  # the preview became the answer
    assert message.raw == final_html and message.parse_mode == "HTML"
    assert message.text == "Streaming answer: " + " ".join(f"w{i}" for i in range(60))
    assert len(bot.calls("sendMessage", U_STREAM)) == 1
    edits = [
        c for c in bot.calls("editMessageText", U_STREAM) if c.params.get("message_id") == message.message_id
    ]
    assert len(edits) >= 2, "expected preview edits before the final edit"
    assert message.edits >= 1
    assert edits[-1].params.get("text") == final_html
    assert edits[-1].params.get("parse_mode") == "HTML"
    # Previews came at most once per stream_edit_interval_s (0.2 s), with some slack; the
    # first one showed only the beginning of the answer.
    [first] = bot.calls("sendMessage", U_STREAM)
    previews = [first.at] + [e.at for e in edits[:-1]]
    assert all(b - a >= 0.15 for a, b in itertools.pairwise(previews)), previews
    assert first.params["text"] != final_html and len(first.params["text"]) < len(final_html)


async def test_no_reply_sends_nothing_and_deletes_the_preview(bot: Bot) -> None:
    # A plain NO_REPLY: not a single message.
    bot.router.on("case-silent-plain", Reply.text("NO_REPLY"))
    await bot.send(bot.dm(U_SILENT, "case-silent-plain just listen"))
    await bot.wait_runs(dm_key(U_SILENT))
    assert bot.tg.sent_messages(U_SILENT, include_deleted=True) == []
    assert bot.calls("sendMessage", U_SILENT) == []

    # Text shown as a preview, then a tool call, then NO_REPLY: the preview is deleted.
    bot.router.on(
        "case-silent-tool",
        Reply.tool_calls(
            [Call("say", {"text": "noted"})], text="Checking the notes first, one moment.", chunk_delay_s=0.05
        ),
        Reply.text("NO_REPLY"),
    )
    await bot.send(bot.dm(U_SILENT, "case-silent-tool take a note"))
    await bot.wait_runs(dm_key(U_SILENT), 2)
    previews = bot.tg.sent_messages(U_SILENT, include_deleted=True)
    assert previews, "the preview was never sent"
    assert all(m.deleted for m in previews)
    assert bot.calls("deleteMessage", U_SILENT)
    assert bot.texts(U_SILENT) == []
    assert not any("NO_REPLY" in str(c.params.get("text")) for c in bot.calls("sendMessage", U_SILENT))
    assert len(bot.requests_for("case-silent-tool")) == 2


async def test_long_answer_is_split_into_parts_within_4096_utf16_units(bot: Bot) -> None:
    # Astral-plane emoji count two UTF-16 units each: the limit is Telegram's, not len().
    paragraphs = [f"para-{i:02d} 🚀 " + "lorem **ipsum** dolor 😀 sit amet " * 12 for i in range(36)]
    bot.router.on("case-long", Reply.text("\n\n".join(paragraphs), chunk_chars=4000))
    await bot.send(bot.dm(U_LONG, "case-long tell me everything"))
    await bot.wait_runs(dm_key(U_LONG))

    parts = bot.bot_messages(U_LONG)
    assert len(parts) >= 3, [utf16_len(p.raw) for p in parts]
    for part in parts:
        assert utf16_len(part.raw) <= 4096 and utf16_len(part.text) <= 4096
        assert part.parse_mode == "HTML"
        assert part.raw.count("<b>") == part.raw.count("</b>")  # formatting balanced in each part
    for call in bot.calls("sendMessage", U_LONG) + bot.calls("editMessageText", U_LONG):
        assert call.status == 200 and utf16_len(str(call.params["text"])) <= 4096
    assert len(bot.calls("sendMessage", U_LONG)) >= len(parts) - 1
    joined = "\n".join(p.text for p in parts)
    positions = [joined.find(f"para-{i:02d}") for i in range(36)]
    assert all(p >= 0 for p in positions) and positions == sorted(positions)
    assert all(joined.count(f"para-{i:02d}") == 1 for i in range(36))
    assert "**" not in joined


async def test_markdown_is_rendered_as_telegram_html(bot: Bot) -> None:
    bot.router.on(
        "case-format", Reply.text("Deploy is **done**, see `log` and [the docs](https://example.com/docs).")
    )
    await bot.send(bot.dm(U_FORMAT, "case-format status?"))
    await bot.wait_runs(dm_key(U_FORMAT))

    [message] = bot.bot_messages(U_FORMAT)
    assert message.parse_mode == "HTML"
    assert "<b>done</b>" in message.raw and "<code>log</code>" in message.raw
    assert '<a href="https://example.com/docs">the docs</a>' in message.raw
    assert message.text == "Deploy is done, see log and the docs."


async def test_html_the_api_cannot_parse_is_resent_as_plain_text(bot: Bot) -> None:
    needle = "zzunparsablezz"
    bot.tg.reject_html.append(needle)
    bot.router.on("case-parse", Reply.text(f"Some **bold** words {needle} here."))
    await bot.send(bot.dm(U_PARSE, "case-parse go"))
    await bot.wait_runs(dm_key(U_PARSE))

    [message] = bot.bot_messages(U_PARSE)
    assert message.text == f"Some bold words {needle} here."
    assert not message.parse_mode and "<b>" not in message.raw
    calls = bot.calls("sendMessage", U_PARSE) + bot.calls("editMessageText", U_PARSE)
    rejected = [
        c
        for c in calls
        if c.status == 400 and c.params.get("parse_mode") == "HTML" and needle in c.params["text"]
    ]
    assert rejected, "the HTML was never tried"
    assert any(
        c.status == 200 and not c.params.get("parse_mode") and needle in c.params["text"] for c in calls
    )


async def test_rate_limit_retry_after_is_honoured_and_the_message_is_sent_once(bot: Bot) -> None:
    bot.router.on("case-flood", Reply.text("Delivered despite the flood limit."))
    bot.tg.rate_limit("sendMessage", retry_after=1)
    await bot.send(bot.dm(U_FLOOD, "case-flood go"))
    await bot.wait_runs(dm_key(U_FLOOD))

    assert bot.texts(U_FLOOD) == ["Delivered despite the flood limit."]
    sends = bot.calls("sendMessage", U_FLOOD)
    assert [c.status for c in sends] == [429, 200]
    assert sends[1].at - sends[0].at >= 0.9, "retried before retry_after elapsed"
    assert any(r.get("retry_after") == 1 for r in bot.log_events("telegram.rate_limited"))


async def test_admin_tool_asks_with_buttons_and_runs_once_approved(bot: Bot) -> None:
    bot.router.on(
        "case-approve",
        Reply.tool_calls([Call("admin_echo", {"text": "approved-payload"})]),
        Reply.text("The admin tool ran."),
    )
    await bot.send(bot.dm(U_APPROVE, "case-approve run the admin tool"))

    def prompt() -> SentMessage | None:
        return next((m for m in bot.bot_messages(U_APPROVE) if m.reply_markup), None)

    await eventually(lambda: prompt() is not None, what="the approval prompt")
    message = prompt()
    assert message is not None
    assert "Approval needed" in message.text and "admin_echo" in message.text
    buttons = [b for row in message.reply_markup["inline_keyboard"] for b in row]  # type: ignore[index]
    data = {b["callback_data"].rsplit(":", 1)[1]: b["callback_data"] for b in buttons}
    assert set(data) == {"y", "n"} and data["y"].startswith("ap:")
    assert len(bot.requests_for("case-approve")) == 1  # the run waits for the answer

    user = bot.tg.user(U_APPROVE, f"U{U_APPROVE}")
    bot.tg.push_update(bot.tg.callback_update(user, message, data["y"]))
    await bot.wait_runs(dm_key(U_APPROVE))
    await bot.wait_text(U_APPROVE, "The admin tool ran.")

    assert "Approved." in bot.texts(U_APPROVE)
    assert any(c.get("text") == "Approved." for c in bot.tg.answered_callbacks)
    assert bot.tg.messages[(U_APPROVE, message.message_id)].reply_markup is None  # buttons removed
    second = bot.requests_for("case-approve")[1]
    tool_results = [m for m in second["messages"] if m["role"] == "tool"]
    assert tool_results and "admin-says approved-payload" in str(tool_results[-1]["content"])


async def test_model_usage_and_the_command_menu(bot: Bot) -> None:
    menu = [c["command"] for c in bot.tg.commands]
    assert {"compact", "model", "usage"} <= set(menu)

    await bot.send(bot.dm(U_CONTEXT, "/model"))
    listing = await bot.wait_text(U_CONTEXT, "Models")
    assert "gpt-4o-mini (128,000 tokens of context) — current" in listing.text and "gpt-4o (64,000" in listing.text
    await bot.send(bot.dm(U_CONTEXT, "/model gpt-4o"))
    await bot.wait_text(U_CONTEXT, "now uses gpt-4o")

    usage = {"prompt_tokens": 3_000, "completion_tokens": 500, "total_tokens": 3_500}
    bot.router.on("case-context", Reply.text("On the bigger model.", usage=usage))
    await bot.send(bot.dm(U_CONTEXT, "case-context which model?"))
    await bot.wait_runs(dm_key(U_CONTEXT))
    [request] = bot.requests_for("case-context")
    assert request["model"] == "gpt-4o" and request["max_tokens"] == 2048

    await bot.send(bot.dm(U_CONTEXT, "/usage"))
    report = await bot.wait_text(U_CONTEXT, "Last run:")
    assert "Model: gpt-4o\n" in report.text
    assert "Last run: 3,000 prompt + 500 completion tokens" in report.text
    assert "Context: about 3,500 of 64,000 tokens (5%)" in report.text
    assert "Cost: 0.0040 last run, 0.0040 total" in report.text

    await bot.send(bot.dm(U_CONTEXT, "/compact"))
    await bot.wait_text(U_CONTEXT, "Nothing to compact yet: 2 message(s)")


async def test_new_status_and_help_are_answered(bot: Bot) -> None:
    bot.router.on("case-before-new", Reply.text("Remembered."))
    await bot.send(bot.dm(U_COMMANDS, "case-before-new remember this"))
    await bot.wait_runs(dm_key(U_COMMANDS))

    await bot.send(bot.dm(U_COMMANDS, "/status"))
    status = await bot.wait_text(U_COMMANDS, "Model:")
    assert (
        "gpt-4o-mini" in status.text and "Active run: no" in status.text and "Queue: 0 waiting" in status.text
    )

    await bot.send(bot.dm(U_COMMANDS, "/help"))
    help_text = await bot.wait_text(U_COMMANDS, "Commands:")
    assert all(cmd in help_text.text for cmd in ("/stop", "/new", "/status", "/help"))

    await bot.send(bot.dm(U_COMMANDS, "/new"))
    await bot.wait_text(U_COMMANDS, "Started a fresh session.")
    bot.router.on("case-after-new", Reply.text("Fresh start."))
    await bot.send(bot.dm(U_COMMANDS, "case-after-new what did I say?"))
    await bot.wait_runs(dm_key(U_COMMANDS), 2)
    [after] = bot.requests_for("case-after-new")
    assert "case-before-new" not in json.dumps(after["messages"])
    # Control commands never reach the model.
    assert not any(last_user_text(r).startswith(("/status", "/help", "/new")) for r in bot.llm.requests)
    assert bot.texts(U_COMMANDS)[-1] == "Fresh start."


# -- groups ---------------------------------------------------------------------------------


async def test_group_needs_a_mention_or_a_reply_and_is_answered_as_a_reply(bot: Bot) -> None:
    tg = bot.tg
    bot.router.on("case-group-mention", Reply.text("Answer to the mention."))
    bot.router.on("case-group-reply", Reply.text("Answer to the reply."))
    await bot.send(tg.group_message(G_MENTION, U_GROUP, "case-group-plain chatting among ourselves"))
    mention = tg.group_message(G_MENTION, U_GROUP, f"@{BOT_USERNAME} case-group-mention what's up?")
    await bot.send(mention)
    await bot.wait_runs(group_key(G_MENTION))

    [answer] = bot.bot_messages(G_MENTION)
    assert answer.text == "Answer to the mention."
    assert answer.reply_to == mention["message_id"]
    assert not bot.requests_for("case-group-plain")
    [request] = bot.requests_for("case-group-mention")
    assert f"@{BOT_USERNAME}" not in last_user_text(request)

    reply = tg.group_message(G_MENTION, U_GROUP, "case-group-reply and then?", reply_to=answer.message_id)
    await bot.send(reply)
    await bot.wait_runs(group_key(G_MENTION), 2)
    second = bot.bot_messages(G_MENTION)[-1]
    assert second.text == "Answer to the reply."
    assert second.reply_to == reply["message_id"]
    assert len(bot.requests_for("case-group-reply")) == 1


async def test_forum_topic_reply_lands_in_its_topic_and_general_has_no_thread(bot: Bot) -> None:
    tg = bot.tg
    topic = 77
    bot.router.on("case-topic", Reply.text("Answer in the topic."))
    bot.router.on("case-general", Reply.text("Answer in General."))
    in_topic = tg.group_message(
        G_FORUM, U_GROUP, f"@{BOT_USERNAME} case-topic hi", forum=True, topic_id=topic
    )
    await bot.send(in_topic)
    await bot.wait_runs(group_key(G_FORUM, topic))
    general = tg.group_message(G_FORUM, U_GROUP, f"@{BOT_USERNAME} case-general hi", forum=True)
    await bot.send(general)
    await bot.wait_runs(group_key(G_FORUM))

    by_text = {m.text: m for m in bot.bot_messages(G_FORUM)}
    assert set(by_text) == {"Answer in the topic.", "Answer in General."}
    assert by_text["Answer in the topic."].thread_id == topic
    assert by_text["Answer in the topic."].reply_to == in_topic["message_id"]
    assert by_text["Answer in General."].thread_id is None
    assert by_text["Answer in General."].reply_to == general["message_id"]

    def sends_replying_to(message: dict[str, Any]) -> list[Any]:
        return [
            c
            for c in bot.calls("sendMessage", G_FORUM)
            if (c.params.get("reply_parameters") or {}).get("message_id") == message["message_id"]
        ]

    assert sends_replying_to(general) and all(
        "message_thread_id" not in c.params for c in sends_replying_to(general)
    )
    assert sends_replying_to(in_topic)
    assert all(c.params.get("message_thread_id") == topic for c in sends_replying_to(in_topic))
    assert any(c.params.get("message_thread_id") == topic for c in bot.calls("sendChatAction", G_FORUM))


# -- webhook mode ---------------------------------------------------------------------------


async def test_webhook_rejects_a_missing_or_wrong_secret_and_answers_the_right_one(hook_bot: Bot) -> None:
    bot = hook_bot
    tg = bot.tg
    bot.router.on("case-hook-ok", Reply.text("Webhook answer."))

    def update(marker: str) -> dict[str, Any]:
        return {"update_id": bot.next_update_id(), "message": bot.dm(U_HOOK, marker)}

    assert await tg.deliver_webhook(update("case-hook-wrong"), secret="not-the-secret") == 403
    assert await tg.deliver_webhook(update("case-hook-missing"), secret=None) == 401

    good = update("case-hook-ok")
    hits = await bot.dedupe_hits()
    assert await tg.deliver_webhook(good) == 200
    assert await tg.deliver_webhook(good) == 200  # Telegram retrying the same update: answered once
    await bot.wait_runs(dm_key(U_HOOK))
    await asyncio.sleep(0.5)

    assert bot.texts(U_HOOK) == ["Webhook answer."]
    assert len(bot.requests_for("case-hook-ok")) == 1
    assert await bot.dedupe_hits() == hits + 1
    assert not bot.requests_for("case-hook-wrong") and not bot.requests_for("case-hook-missing")
    assert len(bot.runs_finished(dm_key(U_HOOK))) == 1
    assert bot.tg.calls_to("getUpdates") == []  # webhook mode never polls


async def test_webhook_group_mention_is_answered(hook_bot: Bot) -> None:
    bot = hook_bot
    bot.router.on("case-hook-group", Reply.text("Group answer over the webhook."))
    message = bot.tg.group_message(G_MENTION, U_GROUP, f"@{BOT_USERNAME} case-hook-group hello")
    await bot.send(message)
    await bot.wait_runs(group_key(G_MENTION))
    [answer] = bot.bot_messages(G_MENTION)
    assert answer.text == "Group answer over the webhook."
    assert answer.reply_to == message["message_id"]
