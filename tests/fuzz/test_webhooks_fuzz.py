"""The Telegram webhook and Slack events routes over real HTTP, behind bot.http_server.HttpServer.

Random methods, headers, content types and bodies (garbage, JSON, mutated real updates
and envelopes, signed and unsigned) always get a 2xx or 4xx, never a 5xx; valid signed
requests get 2xx and exactly one submit with the text intact; bodies over the server's
``max_body_bytes`` get 413 whether announced by Content-Length, sent chunked, or
inflated from a small gzip body.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from bot.http_server import HttpServer
from channels.slack import SlackChannel, SlackSettings
from channels.telegram.webhook import SECRET_HEADER
from tests.fakes.slack_context import RecordingContext as SlackRecorder
from tests.fakes.slack_context import RedisKeyValue
from tests.fakes.slack_server import (
    FakeSlack,
    block_action,
    event_callback,
    message_event,
    sign,
    slash_command,
)
from tests.fakes.telegram_context import TelegramHarness
from tests.fuzz.strategies import hostile_text, json_values, mutate, text_without

pytestmark = pytest.mark.timeout(120)

LIMIT = 8192
SECRET = "fuzz_Secret-123"
TELEGRAM_PATH, SLACK_PATH = "/telegram", "/slack/events"
ALLOWED_TG, ALLOWED_SLACK = 42, "U1"


def _fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@dataclass
class Stack:
    base: str
    http: aiohttp.ClientSession
    tg: TelegramHarness
    slack: FakeSlack
    slack_rec: SlackRecorder

    async def post(self, path: str, body: Any, headers: dict[str, str], method: str = "POST") -> int:
        try:
            async with self.http.request(method, self.base + path, data=body, headers=headers) as resp:
                await resp.read()
                return resp.status
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError):
            # The server may answer and close before a large body is fully sent; ask what it said.
            return -1


@pytest.fixture
async def stack(redis_client: aioredis.Redis, redis_prefix: str) -> AsyncIterator[Stack]:
    server = HttpServer("127.0.0.1", 0, LIMIT, readiness=_ready)
    async with TelegramHarness(redis_client, redis_prefix) as tg, FakeSlack() as fake_slack:
        tg.recorder.app = server.app  # the channel mounts its webhook route on the real server
        await tg.channel(mode="webhook", webhook_url="https://bot.example/telegram", webhook_secret=SECRET,
                         allow_from=(str(ALLOWED_TG),), groups=("-100",))
        slack_rec = SlackRecorder(RedisKeyValue(redis_client, f"{redis_prefix}s"))
        slack = SlackChannel(SlackSettings(
            bot_token=fake_slack.bot_token, signing_secret=fake_slack.signing_secret, mode="http",
            api_base_url=fake_slack.api_url, events_path=SLACK_PATH, allow_from=(ALLOWED_SLACK,), channels=("C1",),
        ))
        await slack.start(slack_rec.ctx)
        for method, path, handler in slack_rec.routes:
            server.add_route(method, path, handler)
        await server.start()
        try:
            async with aiohttp.ClientSession() as http:
                yield Stack(f"http://127.0.0.1:{server.port}", http, tg, fake_slack, slack_rec)
        finally:
            await server.stop()
            await slack.stop()


async def _ready() -> dict[str, bool]:
    return {"test": True}


def _no_5xx(status: int) -> None:
    assert status == -1 or 200 <= status < 500, status
    if currently_in_test_context():
        event(f"status {status}")


# -- strategies -----------------------------------------------------------------------------------

_header_value = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
_header_name = st.sampled_from(["X-Foo", "Accept", "Content-Encoding", "Transfer-Encoding", "Expect", "Cookie",
                                "X-Slack-Retry-Num", "X-Slack-Retry-Reason", "Origin", "X-Forwarded-For"])
_content_types = st.sampled_from([
    "application/json", "application/json; charset=utf-8", "application/x-www-form-urlencoded", "text/plain",
    "multipart/form-data; boundary=x", "application/octet-stream", "", "application/json; charset=latin-1",
    "application/json; charset=nonsense", "*/*", "application/xml",
])
_garbage = st.one_of(
    st.binary(max_size=600),
    st.text(max_size=300).map(lambda s: s.encode("utf-8", "surrogatepass")),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.sampled_from([b"", b"{", b"null", b"[]", b"{}", b'{"update_id": "1"}', b'{"update_id": 1.5}',
                     b'{"update_id": 1, "message": {"chat": {"id": "x"}}}', b"[" * 5000, b'{"a":' * 2000,
                     b'{"update_id": 1, "message": {"message_id": 1, "date": 1, "text": "\\ud800", '
                     b'"chat": {"id": 42, "type": "private"}, "from": {"id": 42, "is_bot": false, "first_name": "A"}}}',
                     b"\xef\xbb\xbf{}", b"\xff\xfe{\x00}\x00", b'{"type": "event_callback", "event": []}',
                     b'{"type": "url_verification"}', b'{"type": "event_callback", "event": {"type": "message"}}',
                     b"payload=%7B%22type%22%3A%22block_actions%22%7D", b"command=%2Fbotd&text=stop",
                     b"payload=not+json", b"ssl_check=1", b"a=1&&b", b"payload=%7B%7D&command=x"]),
)


@st.composite
def telegram_updates(draw: st.DrawFn, tg: TelegramHarness) -> dict[str, Any]:
    fake = tg.fake
    text = draw(hostile_text)
    user = draw(st.sampled_from([ALLOWED_TG, 7]))
    kind = draw(st.integers(0, 3))
    if kind == 0:
        msg = fake.private_message(user, text)
    elif kind == 1:
        msg = fake.group_message(-100, user, f"@{fake.bot_user['username']} {text}")
    elif kind == 2:
        return fake.callback_update(fake.user(user), fake.private_message(user, "q"), "ap:abc:y")
    else:
        msg = fake.private_message(user, None, caption=text,
                                   media={"photo": [{"file_id": "f", "file_unique_id": "u", "width": 1, "height": 1}]})
    return {"message": msg}


@st.composite
def slack_bodies(draw: st.DrawFn, team: str) -> tuple[bytes, str]:
    """A body Slack could send, and its content type."""
    text = draw(hostile_text)
    kind = draw(st.integers(0, 4))
    if kind == 0:
        ts = f"{time.time():.6f}"
        event_ = draw(st.sampled_from([
            message_event(text, channel="D1", user=ALLOWED_SLACK, ts=ts, channel_type="im"),
            message_event(f"<@UBOT> {text}", channel="C1", user=ALLOWED_SLACK, ts=ts, kind="app_mention"),
            message_event(text, channel="C1", user="U2", ts=ts, thread_ts="1.1"),
            message_event(text, channel="C1", user=ALLOWED_SLACK, ts=ts, subtype="message_changed"),
        ]))
        payload: Any = event_callback(event_, team_id=team)
        return json.dumps(mutate(payload, draw) if draw(st.booleans()) else payload).encode(), "application/json"
    if kind == 1:
        form = slash_command(text, channel="C1", user=draw(st.sampled_from([ALLOWED_SLACK, "U2"])), team_id=team)
        if draw(st.booleans()):
            form = mutate(form, draw)
        return urlencode({str(k): str(v) for k, v in form.items()}).encode(), "application/x-www-form-urlencoded"
    if kind == 2:
        action = block_action("approve", draw(st.text(max_size=30)), user=ALLOWED_SLACK, channel="C1", team_id=team,
                              message_ts="1.1")
        if draw(st.booleans()):
            action = mutate(action, draw)
        return urlencode({"payload": json.dumps(action)}).encode(), "application/x-www-form-urlencoded"
    if kind == 3:
        challenge = draw(json_values)
        return json.dumps({"type": "url_verification", "challenge": challenge, "token": "t"}).encode(), \
            "application/json"
    return json.dumps(draw(json_values.filter(lambda v: isinstance(v, dict))) | {"type": draw(st.text(max_size=20))}) \
        .encode(), "application/json"


# -- Telegram ---------------------------------------------------------------------------------------


@_fuzz(250)
@given(data=st.data())
async def test_telegram_webhook_answers_garbage_with_4xx(stack: Stack, data: st.DataObject) -> None:
    secret = data.draw(st.one_of(st.just(SECRET), st.none(), _header_value))
    headers = {"Content-Type": data.draw(_content_types)}
    if secret is not None:
        headers[SECRET_HEADER] = secret
    headers.update(data.draw(st.dictionaries(_header_name, _header_value, max_size=2)))
    headers.pop("Transfer-Encoding", None)
    headers.pop("Content-Encoding", None)
    if data.draw(st.booleans()):
        update = mutate(data.draw(telegram_updates(stack.tg)), data.draw)
        body = json.dumps({"update_id": data.draw(st.integers(-5, 2**40)), **update}).encode()
    else:
        body = data.draw(_garbage)
    method = data.draw(st.sampled_from(["POST"] * 6 + ["GET", "PUT", "DELETE", "PATCH"]))
    before = len(stack.tg.recorder.requests)
    status = await stack.post(TELEGRAM_PATH, body, headers, method)
    _no_5xx(status)
    new = stack.tg.recorder.requests[before:]
    assert len(new) <= (1 if status == 200 else 0)
    if secret != SECRET:
        assert (status == -1 or 400 <= status < 500) and not new, status


@_fuzz(120)
@given(data=st.data())
async def test_telegram_valid_updates_are_submitted_once_with_their_text(stack: Stack, data: st.DataObject) -> None:
    fake = stack.tg.fake
    text = data.draw(text_without("@"))
    update = {"update_id": data.draw(st.integers(1, 2**40)), "message": fake.private_message(ALLOWED_TG, text)}
    body = json.dumps(update, ensure_ascii=data.draw(st.booleans())).encode()
    if len(body) > LIMIT:
        return
    before = len(stack.tg.recorder.requests)
    status = await stack.post(TELEGRAM_PATH, body, {SECRET_HEADER: SECRET, "Content-Type": "application/json"})
    assert status == 200
    [request] = stack.tg.recorder.requests[before:]
    assert request.text == text.strip()
    assert request.dedupe_key == f"telegram:{update['update_id']}"


_USER = {"id": ALLOWED_TG, "is_bot": False, "first_name": "Ann"}
_CHAT = {"id": ALLOWED_TG, "type": "private"}


@pytest.mark.parametrize(
    "message",
    [
        {"message_id": 1, "date": 1, "from": _USER, "text": "no chat"},
        {"message_id": 1, "date": 1, "chat": _CHAT, "from": _USER, "text": ["a", "list"]},
        {"message_id": 1, "date": 1, "chat": _CHAT, "from": {**_USER, "first_name": ["x"]}, "text": "hi"},
        {"message_id": 1, "date": 1, "chat": _CHAT, "from": _USER, "text": "lone \ud800 surrogate"},
        {"message_id": 1, "date": 1, "chat": _CHAT, "from": _USER, "location": {"latitude": "n", "longitude": 1}},
    ],
    ids=["no-chat", "list-text", "list-name", "lone-surrogate", "string-latitude"],
)
async def test_telegram_malformed_updates_get_400_and_no_submit(stack: Stack, message: dict[str, Any]) -> None:
    body = json.dumps({"update_id": 5, "message": message}).encode()
    status = await stack.post(TELEGRAM_PATH, body, {SECRET_HEADER: SECRET, "Content-Type": "application/json"})
    assert status == 400
    assert stack.tg.recorder.requests == []


# -- Slack ------------------------------------------------------------------------------------------


@_fuzz(250)
@given(data=st.data())
async def test_slack_events_route_answers_garbage_with_4xx(stack: Stack, data: st.DataObject) -> None:
    if data.draw(st.booleans()):
        body, content_type = data.draw(slack_bodies(stack.slack.team_id))
    else:
        body, content_type = data.draw(_garbage), data.draw(_content_types)
    signing = data.draw(st.sampled_from(["valid", "valid", "stale", "future", "wrong", "none", "garbage-ts"]))
    now = int(time.time())
    headers = {"Content-Type": content_type or data.draw(_content_types)}
    if signing == "valid":
        headers.update(sign(body, stack.slack.signing_secret, now))
    elif signing in ("stale", "future"):
        headers.update(sign(body, stack.slack.signing_secret, now + (-1 if signing == "stale" else 1) * 400))
    elif signing == "wrong":
        headers.update(sign(body, "not-the-secret", now))
    elif signing == "garbage-ts":
        headers.update({"X-Slack-Request-Timestamp": data.draw(_header_value), "X-Slack-Signature": "v0=00"})
    headers.update(data.draw(st.dictionaries(_header_name, _header_value, max_size=2)))
    headers.pop("Transfer-Encoding", None)
    headers.pop("Content-Encoding", None)
    method = data.draw(st.sampled_from(["POST"] * 6 + ["GET", "PUT"]))
    status = await stack.post(SLACK_PATH, body, headers, method)
    _no_5xx(status)
    if signing != "valid":
        assert status == -1 or 400 <= status < 500, status


@_fuzz(80)
@given(text=text_without("<>&").filter(lambda t: t.strip().lower() not in ("stop", "!stop")), dm=st.booleans())
async def test_slack_valid_signed_events_are_submitted_once_with_their_text(
    stack: Stack, text: str, dm: bool
) -> None:
    ts = f"{time.time():.6f}{uuid.uuid4().int % 1000:03d}"
    if dm:
        event_ = message_event(text, channel="D1", user=ALLOWED_SLACK, ts=ts, channel_type="im")
    else:
        event_ = message_event(f"<@UBOT> {text}", channel="C1", user=ALLOWED_SLACK, ts=ts, kind="app_mention")
    body = json.dumps(event_callback(event_, team_id=stack.slack.team_id)).encode()
    if len(body) > LIMIT:
        return
    headers = {"Content-Type": "application/json", **sign(body, stack.slack.signing_secret)}
    rec = stack.slack_rec
    before = len(rec.requests)
    assert await stack.post(SLACK_PATH, body, headers) == 200
    # Slack's retry of the same event is answered 200 and submits nothing more.
    assert await stack.post(SLACK_PATH, body, {**headers, "X-Slack-Retry-Num": "1"}) == 200
    await rec.wait_until(lambda: len(rec.requests) > before, within=5.0)
    await asyncio.sleep(0.02)
    [request] = rec.requests[before:]
    assert request.text == text.strip()


_BOLT_BREAKERS = [
    {"type": "event_callback", "authorizations": 5},
    {"type": "event_callback", "authorizations": ["x"]},
    {"type": "event_callback", "event": "type"},
    {"type": "event_callback", "event": {"type": 5}},
    {"type": "event_callback", "event": None, "is_ext_shared_channel": True},
    {"type": "event_callback", "team": "T1", "enterprise": 5},
    {"type": "block_actions", "actions": None},
    {"type": "block_actions", "actions": []},
    {"type": "block_actions", "actions": [{}]},
    {"type": "block_actions", "actions": {"0": 1}},
    {"type": "interactive_message", "callback_id": 5, "actions": []},
    {"type": "dialog_submission", "callback_id": None},
    {"type": "view_submission", "view": "x"},
    {"type": "shortcut", "callback_id": []},
    {"type": "x", "command": 5},
    {"type": "x", "user": "U1", "channel": 5, "team": ["T"]},
]


@pytest.mark.parametrize("payload", _BOLT_BREAKERS, ids=range(len(_BOLT_BREAKERS)))
async def test_signed_payloads_that_break_bolt_get_4xx(stack: Stack, payload: dict[str, Any]) -> None:
    for body, content_type in (
        (json.dumps(payload).encode(), "application/json"),
        (urlencode({"payload": json.dumps(payload)}).encode(), "application/x-www-form-urlencoded"),
    ):
        headers = {"Content-Type": content_type, **sign(body, stack.slack.signing_secret)}
        _no_5xx(await stack.post(SLACK_PATH, body, headers))
    assert stack.slack_rec.requests == []


# -- body limits ------------------------------------------------------------------------------------


async def _chunks(data: bytes, size: int = 1000) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _headers(path: str, body: bytes, stack: Stack) -> dict[str, str]:
    if path == TELEGRAM_PATH:
        return {SECRET_HEADER: SECRET, "Content-Type": "application/json"}
    return {"Content-Type": "application/json", **sign(body, stack.slack.signing_secret)}


def _big_json(size: int) -> bytes:
    return json.dumps({"update_id": 1, "type": "event_callback", "pad": "x" * size}).encode()


@pytest.mark.parametrize("path", [TELEGRAM_PATH, SLACK_PATH])
async def test_oversized_bodies_get_413(stack: Stack, path: str) -> None:
    for size in (LIMIT + 1, 2 * LIMIT, 20 * LIMIT):
        body = _big_json(size)
        headers = _headers(path, body, stack)
        assert await stack.post(path, body, headers) == 413  # announced by Content-Length
        assert await stack.post(path, _chunks(body), headers) in (413, -1)  # chunked: only read tells
        bomb = gzip.compress(body)
        assert len(bomb) < LIMIT
        assert await stack.post(path, bomb, {**headers, "Content-Encoding": "gzip"}) == 413  # inflated on read
    # The server still answers afterwards, and a body at the limit passes the size check.
    async with stack.http.get(stack.base + "/healthz") as resp:
        assert resp.status == 200
    exact = _big_json(LIMIT - 80)
    exact += b" " * (LIMIT - len(exact))
    assert len(exact) == LIMIT
    status = await stack.post(path, _chunks(exact), _headers(path, exact, stack))
    assert status not in (413, -1) and status < 500


@pytest.mark.parametrize("path", [TELEGRAM_PATH, SLACK_PATH])
async def test_chunked_oversize_is_a_413_response(stack: Stack, path: str) -> None:
    """Chunked and just over the limit: the whole body is sent, so the answer can be read."""
    body = _big_json(LIMIT + 10)
    async with stack.http.post(stack.base + path, data=_chunks(body, 4096), headers=_headers(path, body, stack)) as resp:
        assert resp.status == 413
    assert stack.tg.recorder.requests == [] and stack.slack_rec.requests == []


@pytest.mark.parametrize("path", [TELEGRAM_PATH, SLACK_PATH])
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize(
    "body", [b"\x00\x00", b"not compressed at all", gzip.compress(b'{"a": 1}', mtime=0)[:-6]],
    ids=["zeros", "plain", "truncated"],
)
async def test_undecodable_bodies_get_400(stack: Stack, path: str, encoding: str, body: bytes) -> None:
    headers = {**_headers(path, body, stack), "Content-Encoding": encoding}
    status = await stack.post(path, body, headers)
    assert 400 <= status < 500, status  # 400 where it cannot be inflated; a truncated stream may inflate


@_fuzz(60)
@given(data=st.data())
async def test_raw_malformed_http_never_gets_a_5xx(stack: Stack, data: st.DataObject) -> None:
    """Requests no client library would send; each is complete, so the server must answer it."""
    path = data.draw(st.sampled_from([TELEGRAM_PATH, SLACK_PATH, "/healthz", "/nope", "*", "//x", "/telegram?x=%zz"]))
    body = data.draw(st.binary(max_size=300))
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    head, payload = data.draw(st.sampled_from([
        ("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\n{extra}\r\n", body),
        ("POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n{extra}\r\n", chunked),
        ("POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n{extra}\r\n", body + b"\r\n0\r\n\r\n"),
        ("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\nContent-Length: 3\r\n{extra}\r\n", body),
        ("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n{extra}\r\n", body),
        ("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n{extra}\r\n", body),
        ("POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n{extra}\r\n", chunked),
        ("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\nContent-Encoding: gzip\r\n{extra}\r\n", body),
        ("POST {path} HTTP/1.0\r\nContent-Length: {n}\r\n{extra}\r\n", body),
        ("GARBAGE {path}\r\n\r\n", b""),
    ]))
    extra = data.draw(st.sampled_from(["", "X-A: b\r\n", f"{SECRET_HEADER}: {SECRET}\r\n", "Bad Header\r\n",
                                       "X-Long: " + "a" * 9000 + "\r\n", "X-Nul: a\x00b\r\n",
                                       "Content-Type: application/json\r\n", " folded: x\r\n"]))
    raw = head.format(path=path, n=len(payload), extra=extra).encode("latin-1") + payload
    reader, writer = await asyncio.open_connection("127.0.0.1", int(stack.base.rsplit(":", 1)[1]))
    try:
        writer.write(raw)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 3.0)
    except (ConnectionError, TimeoutError):
        line = b""
    finally:
        writer.close()
    if not line:
        event("closed without an answer")
        return
    _no_5xx(int(line.split()[1]))
