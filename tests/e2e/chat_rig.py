"""Shared pieces of the multi-process end-to-end tests (test_replicas.py, test_faults.py).

* :class:`MarkerLLM` — a fake model that answers ``ack <markers>`` for the marker words
  (``mk…``) of the messages it has not answered yet, records which session (``ss…``)
  each request belongs to and how many requests of that session were in flight at once
  (from the request's arrival until its reply finished streaming).
* Inbound traffic the way the platforms send it: signed Slack Events API POSTs and
  Telegram webhook POSTs, to whichever botd replica the test picks.
* Counting what the bot posted: final texts in the fake Slack and the fake Telegram.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.slack_server import FakeSlack, event_callback, message_event, signed_json
from tests.fakes.telegram_server import FakeTelegram

MARK = re.compile(r"\bmk[0-9a-z]+\b")
SESSION = re.compile(r"\bss[0-9a-z]+\b")
EVENTS_PATH = "/slack/events"
WEBHOOK_PATH = "/telegram"
WEBHOOK_SECRET = "e2e-webhook-secret"


async def eventually(
    predicate: Callable[[], bool], within: float = 10.0, what: str | Callable[[], str] = "condition"
) -> None:
    """Wait for ``predicate``; ``what`` names it in the failure, and as a callable is asked
    only then (a daemon's log read at the timeout, not at the start of the wait)."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what() if callable(what) else what}")
        await asyncio.sleep(0.05)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


def unanswered_user_texts(body: dict[str, Any]) -> list[str]:
    """The user messages after the last assistant message (what this request must answer)."""
    out: list[str] = []
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            out = []
        elif message.get("role") == "user":
            out.append(_text(message.get("content")))
    return out


def marks_in(texts: list[str]) -> list[str]:
    seen: list[str] = []
    for text in texts:
        for mark in MARK.findall(text):
            if mark not in seen:
                seen.append(mark)
    return seen


def session_of(body: dict[str, Any]) -> str:
    for text in reversed(unanswered_user_texts(body)):
        found = SESSION.search(text)
        if found:
            return found.group()
    return ""


def assistant_texts(body: dict[str, Any]) -> list[str]:
    return [
        _text(m.get("content"))
        for m in body.get("messages") or []
        if isinstance(m, dict) and m.get("role") == "assistant"
    ]


@dataclass
class Served:
    session: str
    marks: list[str]
    body: dict[str, Any]
    answer: str | None  # the text the reply streams (None for a fault)


class MarkerLLM(FakeOpenAI):
    """See the module docstring. ``script(mark, *replies)`` overrides the next answers
    to requests that carry ``mark``; the default answer is ``ack <marks>``."""

    def __init__(self, *, first_byte_s: float = 0.0, chunk_delay_s: float = 0.0, **kw: Any) -> None:
        super().__init__(responder=self._marker_reply, **kw)
        self.first_byte_s = first_byte_s
        self.default_chunk_delay_s = chunk_delay_s
        self.inflight: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.served: list[Served] = []
        self._scripted: dict[str, deque[Reply]] = {}

    def script_for(self, mark: str, *replies: Reply) -> None:
        self._scripted.setdefault(mark, deque()).extend(replies)

    def requests_with(self, mark: str) -> list[Served]:
        return [s for s in self.served if mark in s.marks]

    def _marker_reply(self, body: dict[str, Any]) -> Reply:
        marks = marks_in(unanswered_user_texts(body))
        reply: Reply | None = None
        for mark in marks:
            queue = self._scripted.get(mark)
            if queue:
                reply = queue.popleft()
                break
        if reply is None:
            reply = Reply.text(
                "ack " + " ".join(marks) if marks else "ok",
                first_byte_delay_s=self.first_byte_s,
                chunk_delay_s=self.default_chunk_delay_s,
            )
        ok = reply.status == 200 and reply.disconnect_after is None and reply.garbage_after is None
        answer = reply.content if ok and reply.stream_error_after is None else None
        self.served.append(Served(session_of(body), marks, body, answer))
        return reply

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()  # aiohttp keeps the body: the real handler reads it again
        except ValueError:
            body = None
        session = session_of(body) if isinstance(body, dict) else ""
        self.inflight[session] += 1
        self.peak[session] = max(self.peak[session], self.inflight[session])
        try:
            return await super()._chat(request)
        finally:
            self.inflight[session] -= 1


# -- inbound -------------------------------------------------------------------------------

_slack_ts = itertools.count(1)
_event_ids = itertools.count(1)
_update_ids = itertools.count(7_000_001)


def new_ts() -> str:
    return f"1810000{next(_slack_ts):04d}.000200"


def slack_dm_body(slack: FakeSlack, user: str, text: str) -> dict[str, Any]:
    """An Events API body: a DM from ``user`` (channel ``D<user>``)."""
    event = message_event(text, channel=f"D{user}", user=user, ts=new_ts(), channel_type="im")
    return event_callback(event, team_id=slack.team_id, event_id=f"EvE2E{next(_event_ids):07d}")


async def post_slack(http: aiohttp.ClientSession, base_url: str, slack: FakeSlack, body: dict[str, Any]) -> int:
    raw, headers = signed_json(body, slack.signing_secret)
    async with http.post(base_url + EVENTS_PATH, data=raw, headers=headers) as resp:
        await resp.read()
        return resp.status


def telegram_dm_update(tg: FakeTelegram, user_id: int, text: str) -> dict[str, Any]:
    return {"update_id": next(_update_ids), "message": tg.private_message(user_id, text)}


async def post_telegram(http: aiohttp.ClientSession, base_url: str, update: dict[str, Any]) -> int:
    headers = {"Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": WEBHOOK_SECRET}
    async with http.post(base_url + WEBHOOK_PATH, data=json.dumps(update), headers=headers) as resp:
        await resp.read()
        return resp.status


# -- outbound ------------------------------------------------------------------------------


def slack_texts(slack: FakeSlack, channel: str | None = None) -> list[str]:
    """The bot's messages as they stand now (previews already turned into final text)."""
    return [
        str(m.get("text") or "")
        for (ch, _), m in sorted(slack.messages.items(), key=lambda kv: float(kv[0][1]))
        if m.get("user") == slack.bot_user_id and (channel is None or ch == channel)
    ]


def telegram_texts(tg: FakeTelegram, chat_id: int | None = None) -> list[str]:
    return [m.text for m in tg.sent_messages(chat_id)]


def count_mark(texts: list[str], mark: str) -> int:
    pattern = re.compile(rf"\b{re.escape(mark)}\b")
    return sum(1 for t in texts if pattern.search(t))


@dataclass
class Ports:
    """The fakes one botd talks to, as config sections."""

    llm: FakeOpenAI
    slack: FakeSlack | None = None
    tg: FakeTelegram | None = None
    slack_users: list[str] = field(default_factory=list)
    slack_channels: list[str] = field(default_factory=list)
    tg_users: list[int] = field(default_factory=list)


def channel_sections(ports: Ports, *, tg_mode: str = "webhook", webhook_url: str | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if ports.slack is not None:
        config["slack"] = {
            "enabled": True,
            "mode": "http",
            "bot_token": ports.slack.bot_token,
            "signing_secret": ports.slack.signing_secret,
            "api_base_url": ports.slack.api_url,
            "events_path": EVENTS_PATH,
            "allow_from": ports.slack_users,
            "channels": ports.slack_channels,
        }
    if ports.tg is not None:
        section: dict[str, Any] = {
            "enabled": True,
            "token": ports.tg.token,
            "api_base_url": ports.tg.base_url,
            "mode": tg_mode,
            "allow_from": [str(u) for u in ports.tg_users],
        }
        if tg_mode == "webhook":
            section.update(webhook_url=webhook_url, webhook_secret=WEBHOOK_SECRET, webhook_path=WEBHOOK_PATH)
        config["telegram"] = section
    return config
