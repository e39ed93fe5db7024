"""Slack end to end: ``botd run`` as a subprocess against the fake Slack and the fake LLM.

Both transports run the same conversations: Socket Mode (envelopes pushed over the
fake's websocket) and HTTP Events (signed POSTs to botd's own HTTP server). One botd
process per transport serves the whole module; every test talks in its own channel
(or DM) with its own marker word, and the fake LLM answers by that marker, so the
tests neither share sessions nor depend on their order.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.e2e.botd_process import ECHO_TOOLS_YAML as TOOLS_YAML
from tests.e2e.botd_process import BotdProcess, botd_run, free_port, write_config
from tests.fakes.marker_router import Router, last_user_text
from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.fakes.slack_server import (
    FakeSlack,
    block_action,
    event_callback,
    message_event,
    signed_interactive,
    signed_json,
)

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

USER = "UALICE"
STRANGER = "UMALLORY"
EVENTS_PATH = "/slack/events"
CHANNELS = [
    "CMENTION",
    "CTHREAD",
    "CSIGN",
    "CRETRY",
    "CTWIN",
    "CSTOP",
    "CSILENT",
    "CLONG",
    "CFORMAT",
    "CAPPROVE",
    "CDENIED",
]

_ts_counter = itertools.count(1)


def new_ts() -> str:
    """A Slack message timestamp, unique in this module (the fake's own start at 1700…)."""
    return f"1800000{next(_ts_counter):03d}.000100"


async def eventually(predicate: Callable[[], bool], within: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


# -- the fake model: replies chosen by a marker word in the last user message ------------


# -- one botd per transport ---------------------------------------------------------------


@dataclass
class Bot:
    mode: str
    slack: FakeSlack
    llm: FakeOpenAI
    router: Router
    botd: BotdProcess
    http: aiohttp.ClientSession
    _event_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def events_url(self) -> str:
        return self.botd.url + EVENTS_PATH

    def event_id(self) -> str:
        return f"Ev{self.mode.upper()}{next(self._event_ids):06d}"

    # inbound ---------------------------------------------------------------------------
    async def send(self, event: dict[str, Any], *, event_id: str | None = None, retry: int = 0) -> None:
        """Deliver one event the way this transport does; Slack's side must see it accepted."""
        event_id = event_id or self.event_id()
        if self.mode == "socket":
            envelope = await self.slack.push_event(event, event_id=event_id, retry_attempt=retry)
            await self.slack.wait_ack(envelope)
            return
        body = event_callback(event, team_id=self.slack.team_id, event_id=event_id)
        extra = {"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_timeout"} if retry else {}
        status, text = await self.post_json(body, extra_headers=extra)
        assert status == 200, text

    async def post_json(
        self,
        body: dict[str, Any],
        *,
        timestamp: int | None = None,
        secret: str | None = None,
        extra_headers: dict[str, str] | None = None,
    ) -> tuple[int, str]:
        raw, headers = signed_json(body, secret or self.slack.signing_secret, timestamp)
        async with self.http.post(
            self.events_url, data=raw, headers={**headers, **(extra_headers or {})}
        ) as resp:
            return resp.status, await resp.text()

    async def interact(self, payload: dict[str, Any]) -> None:
        """A button press: an ``interactive`` envelope, or a signed form POST with ``payload``."""
        if self.mode == "socket":
            await self.slack.wait_ack(await self.slack.send_envelope("interactive", payload))
            return
        raw, headers = signed_interactive(payload, self.slack.signing_secret)
        async with self.http.post(self.events_url, data=raw, headers=headers) as resp:
            assert resp.status == 200, await resp.text()

    async def mention(self, text: str, channel: str) -> str:
        ts = new_ts()
        await self.send(
            message_event(
                f"<@{self.slack.bot_user_id}> {text}", channel=channel, user=USER, ts=ts, kind="app_mention"
            )
        )
        return ts

    # outbound --------------------------------------------------------------------------
    def thread(self, channel: str, thread_ts: str | None) -> list[dict[str, Any]]:
        """The bot's messages now in ``channel`` (in ``thread_ts``; None: top level), oldest first."""
        found = [
            m
            for (ch, _), m in self.slack.messages.items()
            if ch == channel and m.get("thread_ts") == thread_ts
        ]
        return sorted(found, key=lambda m: float(m["ts"]))

    def texts(self, channel: str, thread_ts: str | None) -> list[str]:
        return [str(m.get("text") or "") for m in self.thread(channel, thread_ts)]

    def posts_in(self, channel: str) -> list[dict[str, Any]]:
        return [c.args for c in self.slack.calls_to("chat.postMessage") if c.args.get("channel") == channel]

    def reaction_calls(self, method: str, channel: str, ts: str) -> int:
        return sum(
            1
            for c in self.slack.calls_to(method)
            if (c.args.get("channel"), c.args.get("timestamp"), c.args.get("name")) == (channel, ts, "eyes")
        )

    async def wait_done(self, channel: str, ts: str, within: float = 15.0) -> None:
        """The run answering ``ts`` is over: its :eyes: came off (the last thing a run does)."""
        await eventually(
            lambda: self.reaction_calls("reactions.remove", channel, ts) >= 1,
            within,
            f"the run answering {channel}/{ts} to finish\n{self.botd.log()[-3000:]}",
        )

    def requests_for(self, marker: str) -> list[dict[str, Any]]:
        return [r for r in self.llm.requests if marker in last_user_text(r)]


def botd_config(
    workdir: Path, mode: str, slack: FakeSlack, llm: FakeOpenAI, redis_url: str
) -> dict[str, Any]:
    tools = workdir / "tools.yaml"
    tools.write_text(TOOLS_YAML, encoding="utf-8")
    return {
        "agent": {"workspace": str(workdir / "ws")},
        "llm": {"base_url": llm.base_url, "api_key": "test-key", "max_retries": 0, "request_timeout_s": 30},
        "redis": {"url": redis_url, "prefix": f"e2eslack{mode}{uuid.uuid4().hex[:8]}"},
        "http": {"port": free_port()},
        "slack": {
            "enabled": True,
            "mode": mode,
            "bot_token": slack.bot_token,
            "app_token": slack.app_token,
            "signing_secret": slack.signing_secret,
            "api_base_url": slack.api_url,
            "events_path": EVENTS_PATH,
            "allow_from": [USER],
            "channels": CHANNELS,
        },
        "queue": {"debounce_ms": 0},
        "gateway": {"shutdown_grace_s": 2},
        "security": {"cli_tools_file": str(tools)},
        "log": {"level": "info"},
    }


@contextlib.asynccontextmanager
async def start_bot(mode: str, workdir: Path, redis_url: str) -> AsyncIterator[Bot]:
    router = Router()
    async with FakeSlack() as slack, FakeOpenAI(responder=router) as llm, aiohttp.ClientSession() as http:
        config = botd_config(workdir, mode, slack, llm, redis_url)
        path = write_config(workdir / "botd.yaml", config)
        async with botd_run(path, config["http"]["port"], workdir) as botd:
            await botd.wait_healthy()
            if mode == "socket":
                await slack.wait_connected(within=15)
            status, body = await botd.get("/readyz")
            assert status == 200, body
            yield Bot(mode, slack, llm, router, botd, http)
            assert await botd.terminate() == 0, botd.log()[-3000:]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def socket_bot(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> AsyncIterator[Bot]:
    async with start_bot("socket", tmp_path_factory.mktemp("slack-socket"), redis_url) as bot:
        yield bot


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http_bot(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> AsyncIterator[Bot]:
    async with start_bot("http", tmp_path_factory.mktemp("slack-http"), redis_url) as bot:
        yield bot


@pytest.fixture(params=["socket", "http"])
def bot(request: pytest.FixtureRequest) -> Bot:
    """The test runs once over each transport."""
    return request.getfixturevalue(f"{request.param}_bot")


# -- conversations ------------------------------------------------------------------------


async def test_app_mention_is_answered_in_its_thread_with_eyes_while_working(bot: Bot) -> None:
    channel = "CMENTION"
    bot.router.on("case-mention", Reply.text("Here is the summary you asked for."))
    ts = await bot.mention("case-mention summarize", channel)
    await bot.wait_done(channel, ts)

    assert bot.texts(channel, ts) == ["Here is the summary you asked for."]
    assert all(p.get("thread_ts") == ts for p in bot.posts_in(channel))
    assert bot.thread(channel, None) == []  # nothing at the top level
    [request] = bot.requests_for("case-mention")
    assert last_user_text(request).endswith("case-mention summarize")
    assert "<@" not in last_user_text(request)  # the bot's own mention is stripped
    # :eyes: went on the message being answered and came off again.
    assert bot.reaction_calls("reactions.add", channel, ts) == 1
    assert bot.reaction_calls("reactions.remove", channel, ts) == 1
    assert (channel, ts, "eyes") not in bot.slack.reactions


async def test_dm_is_answered_in_the_dm(bot: Bot) -> None:
    dm = f"D{bot.mode.upper()}1"
    bot.router.on("case-dm", Reply.text("Hi there, in private."))
    ts = new_ts()
    await bot.send(message_event("hello case-dm", channel=dm, user=USER, ts=ts, channel_type="im"))
    await bot.wait_done(dm, ts)
    assert bot.texts(dm, None) == ["Hi there, in private."]
    assert bot.requests_for("case-dm")


async def test_thread_follow_up_without_mention_continues_the_session(bot: Bot) -> None:
    channel = "CTHREAD"
    bot.router.on("case-thread-one", Reply.text("The capital of France is Paris."))
    bot.router.on("case-thread-two", Reply.text("About two million people live there."))
    root = await bot.mention("case-thread-one what is the capital of France?", channel)
    await bot.wait_done(channel, root)

    follow = new_ts()
    await bot.send(
        message_event(
            "case-thread-two and its population?", channel=channel, user=USER, ts=follow, thread_ts=root
        )
    )
    await bot.wait_done(channel, follow)

    assert bot.texts(channel, root) == [
        "The capital of France is Paris.",
        "About two million people live there.",
    ]
    [second] = bot.requests_for("case-thread-two")
    history = [(m["role"], m.get("content") or "") for m in second["messages"] if m["role"] != "system"]
    contents = "\n".join(str(c) for _, c in history)
    assert "case-thread-one" in contents and "The capital of France is Paris." in contents
    roles = [r for r, _ in history]
    assert roles[-3:] == ["user", "assistant", "user"]


async def test_message_from_a_stranger_gets_no_answer(bot: Bot) -> None:
    channel = "CDENIED"
    ts = new_ts()
    await bot.send(
        message_event(
            f"<@{bot.slack.bot_user_id}> case-stranger hi",
            channel=channel,
            user=STRANGER,
            ts=ts,
            kind="app_mention",
        )
    )
    # A barrier: a message of an allowed person after it is answered, the stranger's never.
    allowed = await bot.mention("case-stranger-barrier hi", channel)
    await bot.wait_done(channel, allowed)
    assert not bot.requests_for("case-stranger hi")
    assert bot.thread(channel, ts) == []
    assert bot.reaction_calls("reactions.add", channel, ts) == 0


async def test_slack_retry_gives_one_reply(bot: Bot) -> None:
    channel = "CRETRY"
    bot.router.on("case-retry", Reply.text("Answered once."))
    ts = new_ts()
    event = message_event(
        f"<@{bot.slack.bot_user_id}> case-retry", channel=channel, user=USER, ts=ts, kind="app_mention"
    )
    event_id = bot.event_id()
    await bot.send(event, event_id=event_id)
    await bot.send(event, event_id=event_id, retry=1)
    await bot.wait_done(channel, ts)
    await asyncio.sleep(0.3)  # room for a second (wrong) run
    assert len(bot.requests_for("case-retry")) == 1
    assert bot.texts(channel, ts) == ["Answered once."]
    assert bot.reaction_calls("reactions.add", channel, ts) == 1


async def test_message_and_app_mention_twins_give_one_reply(bot: Bot) -> None:
    channel = "CTWIN"
    bot.router.on("case-twin", Reply.text("One answer for two events."))
    ts = new_ts()
    text = f"<@{bot.slack.bot_user_id}> case-twin"
    await bot.send(message_event(text, channel=channel, user=USER, ts=ts))
    await bot.send(message_event(text, channel=channel, user=USER, ts=ts, kind="app_mention"))
    await bot.wait_done(channel, ts)
    await asyncio.sleep(0.3)
    assert len(bot.requests_for("case-twin")) == 1
    assert bot.texts(channel, ts) == ["One answer for two events."]


async def test_stop_during_a_slow_stream_closes_it_and_posts_only_stopped(bot: Bot) -> None:
    channel = "CSTOP"
    answer = " ".join(f"word{i}" for i in range(400))
    bot.router.on("case-stop", Reply.text(answer, chunk_chars=8, chunk_delay_s=0.05))
    disconnects = bot.llm.disconnects.count
    root = await bot.mention("case-stop write a long essay", channel)
    await eventually(lambda: bool(bot.requests_for("case-stop")), what="the LLM request")
    # The preview placeholder shows the stream is under way.
    await eventually(lambda: any("word0" in t for t in bot.texts(channel, root)), what="a preview")

    stop = new_ts()
    await bot.send(message_event("stop", channel=channel, user=USER, ts=stop, thread_ts=root))
    await bot.llm.disconnects.wait(disconnects + 1, timeout_s=10)
    await bot.wait_done(channel, root)
    await eventually(lambda: "Stopped." in bot.texts(channel, root), what="Stopped.")
    await asyncio.sleep(0.5)  # a final answer, if one were coming, would be here by now

    assert bot.texts(channel, root) == ["Stopped."]  # the placeholder is gone, no answer came
    assert not any("word399" in str(p.get("text")) for p in bot.posts_in(channel))
    assert len(bot.requests_for("case-stop")) == 1


async def test_no_reply_posts_nothing_and_deletes_the_placeholder(bot: Bot) -> None:
    channel = "CSILENT"
    # A plain NO_REPLY: not a single post.
    bot.router.on("case-silent-plain", Reply.text("NO_REPLY"))
    plain = await bot.mention("case-silent-plain just listen", channel)
    await bot.wait_done(channel, plain)
    assert [p for p in bot.posts_in(channel) if p.get("thread_ts") == plain] == []

    # Text shown as a preview, then a tool call, then NO_REPLY: the placeholder is deleted.
    bot.router.on(
        "case-silent-tool",
        Reply.tool_calls(
            [Call("say", {"text": "noted"})], text="Checking the notes first, one moment.", chunk_delay_s=0.05
        ),
        Reply.text("NO_REPLY"),
    )
    root = await bot.mention("case-silent-tool take a note", channel)
    await bot.wait_done(channel, root)
    placeholders = [p for p in bot.posts_in(channel) if p.get("thread_ts") == root]
    assert placeholders, "the preview placeholder was never posted"
    deleted = {
        c.args.get("ts") for c in bot.slack.calls_to("chat.delete") if c.args.get("channel") == channel
    }
    assert deleted, "the placeholder was not deleted"
    assert bot.thread(channel, root) == []
    assert len(bot.requests_for("case-silent-tool")) == 2


async def test_long_answer_is_split_into_several_posts_in_the_thread(bot: Bot) -> None:
    channel = "CLONG"
    paragraphs = [f"para-{i:02d} " + "lorem ipsum dolor sit amet " * 12 for i in range(36)]
    bot.router.on("case-long", Reply.text("\n\n".join(paragraphs), chunk_chars=2000))
    root = await bot.mention("case-long tell me everything", channel)
    await bot.wait_done(channel, root)

    parts = bot.texts(channel, root)
    assert len(parts) >= 3, [len(p) for p in parts]
    assert all(len(p) <= 4000 for p in parts)
    joined = "\n".join(parts)
    positions = [joined.find(f"para-{i:02d}") for i in range(36)]
    assert all(p >= 0 for p in positions) and positions == sorted(positions)
    assert all(joined.count(f"para-{i:02d}") == 1 for i in range(36))


async def test_markdown_is_rendered_as_mrkdwn_and_broadcasts_are_neutralized(bot: Bot) -> None:
    channel = "CFORMAT"
    bot.router.on("case-format", Reply.text("Deploy is **done** now <!channel> and <@UOTHER>, see `log`."))
    root = await bot.mention("case-format status?", channel)
    await bot.wait_done(channel, root)
    [text] = bot.texts(channel, root)
    assert "*done*" in text and "**" not in text
    assert "<!channel>" not in text and "&lt;!channel&gt;" in text
    assert "<@UOTHER>" not in text
    assert "`log`" in text


async def test_admin_tool_asks_with_buttons_and_runs_once_approved(bot: Bot) -> None:
    channel = "CAPPROVE"
    bot.router.on(
        "case-approve",
        Reply.tool_calls([Call("admin_echo", {"text": "approved-payload"})]),
        Reply.text("The admin tool ran."),
    )
    root = await bot.mention("case-approve run the admin tool", channel)

    def prompt() -> dict[str, Any] | None:
        for message in bot.thread(channel, root):
            for block in message.get("blocks") or []:
                if block.get("type") == "actions":
                    return message
        return None

    await eventually(lambda: prompt() is not None, what="the approval prompt")
    message = prompt()
    assert message is not None
    actions = next(b for b in message["blocks"] if b.get("type") == "actions")
    buttons = {e["action_id"]: e["value"] for e in actions["elements"]}
    assert set(buttons) == {"botd_approve", "botd_deny"}
    assert "admin_echo" in json.dumps(message["blocks"])
    assert len(bot.requests_for("case-approve")) == 1  # the run waits for the answer

    await bot.interact(
        block_action(
            "botd_approve",
            buttons["botd_approve"],
            user=USER,
            channel=channel,
            team_id=bot.slack.team_id,
            message_ts=message["ts"],
            thread_ts=root,
            message=message,
        )
    )
    await bot.wait_done(channel, root)

    texts = bot.texts(channel, root)
    assert "The admin tool ran." in texts
    assert "Approved." in texts
    # The prompt lost its buttons and says who approved.
    decided = bot.slack.messages[(channel, message["ts"])]
    assert not any(b.get("type") == "actions" for b in decided.get("blocks") or [])
    assert f"<@{USER}>" in decided["text"]
    # The tool really ran, and its output went back to the model.
    second = bot.requests_for("case-approve")[1]
    tool_results = [m for m in second["messages"] if m["role"] == "tool"]
    assert tool_results and "admin-says approved-payload" in str(tool_results[-1]["content"])


# -- HTTP only: the signed route ----------------------------------------------------------


async def test_bad_signature_and_stale_timestamp_are_rejected_before_anything_runs(http_bot: Bot) -> None:
    bot = http_bot
    channel = "CSIGN"

    def body(marker: str) -> dict[str, Any]:
        event = message_event(
            f"<@{bot.slack.bot_user_id}> {marker}",
            channel=channel,
            user=USER,
            ts=new_ts(),
            kind="app_mention",
        )
        return event_callback(event, team_id=bot.slack.team_id, event_id=bot.event_id())

    status, _ = await bot.post_json(body("case-badsig"), secret="not-the-signing-secret")
    assert status == 401
    status, _ = await bot.post_json(body("case-stale"), timestamp=int(time.time()) - 600)
    assert status == 401
    raw, headers = signed_json(body("case-tampered"), bot.slack.signing_secret)
    tampered = raw.replace(b"case-tampered", b"case-tamperex")
    async with bot.http.post(bot.events_url, data=tampered, headers=headers) as resp:
        assert resp.status == 401

    # A correctly signed event after them is answered; none of the rejected ones ever was.
    good = body("case-signed-ok")
    status, _ = await bot.post_json(good)
    assert status == 200
    await bot.wait_done(channel, good["event"]["ts"])
    for marker in ("case-badsig", "case-stale", "case-tampere"):
        assert not bot.requests_for(marker), marker
    assert len(bot.posts_in(channel)) == 1
