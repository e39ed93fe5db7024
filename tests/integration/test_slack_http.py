"""The Slack channel over signed HTTP Events: the route served by a real aiohttp server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from agent.types import RunRequest
from channels.base import SubmitResult
from channels.slack import SlackChannel, SlackSettings
from tests.fakes.slack_context import RecordingContext, RedisKeyValue
from tests.fakes.slack_server import (
    FakeSlack,
    block_action,
    event_callback,
    message_event,
    sign,
    signed_form,
    signed_interactive,
    signed_json,
    slash_command,
)

EVENTS_PATH = "/slack/events"


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


@pytest.fixture
def rec(redis_client: aioredis.Redis, redis_prefix: str) -> RecordingContext:
    return RecordingContext(RedisKeyValue(redis_client, redis_prefix))


@pytest.fixture
async def channel(fake: FakeSlack, rec: RecordingContext) -> AsyncIterator[SlackChannel]:
    settings = SlackSettings(
        bot_token=fake.bot_token,
        signing_secret=fake.signing_secret,
        mode="http",
        api_base_url=fake.api_url,
        events_path=EVENTS_PATH,
        allow_from=("U1",),
        channels=("C1",),
    )
    ch = SlackChannel(settings, observer=rec.observe)
    await ch.start(rec.ctx)
    try:
        yield ch
    finally:
        await ch.stop()


@pytest.fixture
async def url(rec: RecordingContext, channel: SlackChannel) -> AsyncIterator[str]:
    async with rec.serve(max_body_bytes=64 * 1024) as base:
        yield base + EVENTS_PATH


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def event_body(fake: FakeSlack, event: dict[str, Any], event_id: str | None = None) -> dict[str, Any]:
    return event_callback(event, team_id=fake.team_id, event_id=event_id)


async def post(
    http: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> tuple[int, str]:
    async with http.post(url, data=body, headers=headers) as resp:
        return resp.status, await resp.text()


async def test_route_is_registered_and_ready(rec: RecordingContext, channel: SlackChannel) -> None:
    assert [(m, p) for m, p, _ in rec.routes] == [("POST", EVENTS_PATH)]
    assert channel.is_ready()


async def test_url_verification_answers_the_challenge(
    fake: FakeSlack, url: str, http: aiohttp.ClientSession
) -> None:
    body, headers = signed_json(
        {"token": "t", "challenge": "c-123", "type": "url_verification"}, fake.signing_secret
    )
    status, text = await post(http, url, body, headers)
    assert status == 200
    assert json.loads(text) == {"challenge": "c-123"}


async def test_app_mention_submits_thread_session(
    fake: FakeSlack, rec: RecordingContext, url: str, http: aiohttp.ClientSession
) -> None:
    event = message_event("<@UBOT> deploy it", channel="C1", user="U1", ts="21.1", kind="app_mention")
    body, headers = signed_json(event_body(fake, event), fake.signing_secret)
    status, _ = await post(http, url, body, headers)
    assert status == 200
    [req] = await rec.wait_requests(1)
    assert req.session_key == "agent:main:slack:channel:C1:thread:21.1"
    assert (req.thread_id, req.text) == ("21.1", "deploy it")


async def test_dm_and_thread_follow_up(
    fake: FakeSlack, rec: RecordingContext, url: str, http: aiohttp.ClientSession
) -> None:
    for event in (
        message_event("hi there", channel="D5", user="U1", ts="22.1", channel_type="im"),
        message_event("<@UBOT> start", channel="C1", user="U1", ts="23.1", kind="app_mention"),
    ):
        body, headers = signed_json(event_body(fake, event), fake.signing_secret)
        assert (await post(http, url, body, headers))[0] == 200
    await rec.wait_requests(2)
    body, headers = signed_json(
        event_body(fake, message_event("more", channel="C1", user="U1", ts="23.2", thread_ts="23.1")),
        fake.signing_secret,
    )
    await post(http, url, body, headers)
    reqs = {r.text: r for r in await rec.wait_requests(3)}
    assert reqs["hi there"].session_key == "agent:main:slack:dm:U1"
    assert reqs["more"].session_key == reqs["start"].session_key


@pytest.mark.parametrize(
    "tamper",
    ["signature", "secret", "stale", "future", "missing", "garbage_ts"],
)
async def test_bad_or_stale_signature_is_401_and_never_submits(
    fake: FakeSlack, rec: RecordingContext, url: str, http: aiohttp.ClientSession, tamper: str
) -> None:
    event = message_event("<@UBOT> hi", channel="C1", user="U1", ts="24.1", kind="app_mention")
    body, headers = signed_json(event_body(fake, event), fake.signing_secret)
    if tamper == "signature":
        headers["X-Slack-Signature"] = "v0=" + "0" * 64
    elif tamper == "secret":
        headers.update(sign(body, "not-the-secret"))
    elif tamper == "stale":
        headers.update(sign(body, fake.signing_secret, int(time.time()) - 301))
    elif tamper == "future":
        headers.update(sign(body, fake.signing_secret, int(time.time()) + 400))
    elif tamper == "missing":
        del headers["X-Slack-Signature"]
    else:
        headers["X-Slack-Request-Timestamp"] = "yesterday"
    status, _ = await post(http, url, body, headers)
    assert status == 401
    # a valid request afterwards is the only one that reaches the intake
    ok_event = message_event("<@UBOT> real", channel="C1", user="U1", ts="24.2", kind="app_mention")
    ok_body, ok_headers = signed_json(event_body(fake, ok_event), fake.signing_secret)
    assert (await post(http, url, ok_body, ok_headers))[0] == 200
    await rec.wait_requests(1)
    assert [r.text for r in rec.requests] == ["real"]
    assert len(rec.outcomes) == 1


async def test_timestamp_within_five_minutes_is_accepted(
    fake: FakeSlack, rec: RecordingContext, url: str, http: aiohttp.ClientSession
) -> None:
    event = message_event("<@UBOT> old but fine", channel="C1", user="U1", ts="25.1", kind="app_mention")
    body, headers = signed_json(event_body(fake, event), fake.signing_secret, int(time.time()) - 240)
    assert (await post(http, url, body, headers))[0] == 200
    await rec.wait_requests(1)


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"{not json", "application/json"),
        (b"[1, 2]", "application/json"),
        (b'{"no_type": 1}', "application/json"),
        (b"a=1&b=2", "application/x-www-form-urlencoded"),
        (b"", "application/x-www-form-urlencoded"),
        (b"payload=%7Bbroken", "application/x-www-form-urlencoded"),
        (b"hello", "text/plain"),
    ],
)
async def test_malformed_signed_bodies_are_400(
    fake: FakeSlack,
    rec: RecordingContext,
    url: str,
    http: aiohttp.ClientSession,
    body: bytes,
    content_type: str,
) -> None:
    headers = {"Content-Type": content_type, **sign(body, fake.signing_secret)}
    status, text = await post(http, url, body, headers)
    assert status == 400
    assert json.loads(text)["ok"] is False
    assert rec.requests == [] and rec.outcomes == []


async def test_non_utf8_body_is_rejected(fake: FakeSlack, url: str, http: aiohttp.ClientSession) -> None:
    body = b'{"type": "\xff"}'
    status, _ = await post(
        http, url, body, {"Content-Type": "application/json", **sign(body, fake.signing_secret)}
    )
    assert status == 401


async def test_oversize_body_is_refused_by_the_server(
    fake: FakeSlack, url: str, http: aiohttp.ClientSession
) -> None:
    event = message_event("<@UBOT> " + "x" * 70_000, channel="C1", user="U1", ts="26.1", kind="app_mention")
    body, headers = signed_json(event_body(fake, event), fake.signing_secret)
    status, _ = await post(http, url, body, headers)
    assert status == 413


async def test_ssl_check_is_answered(
    fake: FakeSlack, rec: RecordingContext, url: str, http: aiohttp.ClientSession
) -> None:
    body, headers = signed_form({"ssl_check": "1", "token": "legacy"}, fake.signing_secret)
    assert (await post(http, url, body, headers))[0] == 200
    assert rec.requests == []


async def test_slack_retry_submits_once(
    fake: FakeSlack, rec: RecordingContext, url: str, http: aiohttp.ClientSession
) -> None:
    event = message_event("<@UBOT> once please", channel="C1", user="U1", ts="27.1", kind="app_mention")
    body, headers = signed_json(event_body(fake, event, "EvRETRY"), fake.signing_secret)
    assert (await post(http, url, body, headers))[0] == 200
    retry_headers = {**headers, "X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}
    assert (await post(http, url, body, retry_headers))[0] == 200
    outcomes = await rec.wait_outcomes(2)
    assert sorted(o.status for _, o in outcomes) == ["duplicate", "submitted"]
    assert len(rec.requests) == 1


async def test_twin_events_submit_once(
    fake: FakeSlack, rec: RecordingContext, url: str, http: aiohttp.ClientSession
) -> None:
    post_fields = {"channel": "C1", "user": "U1", "ts": "28.1"}
    for kind in ("message", "app_mention"):
        event = message_event("<@UBOT> twin", kind=kind, **post_fields)
        body, headers = signed_json(event_body(fake, event), fake.signing_secret)
        assert (await post(http, url, body, headers))[0] == 200
    await rec.wait_outcomes(2)
    assert len(rec.requests) == 1


@pytest.mark.parametrize("text", ["stop", "!stop"])
async def test_stop_word(
    fake: FakeSlack, rec: RecordingContext, url: str, http: aiohttp.ClientSession, text: str
) -> None:
    event = message_event(text, channel="D5", user="U1", ts="29.1", channel_type="im")
    body, headers = signed_json(event_body(fake, event), fake.signing_secret)
    await post(http, url, body, headers)
    [req] = await rec.wait_requests(1)
    assert req.text == "/stop"


async def test_slash_command_acks_ephemerally(
    fake: FakeSlack, rec: RecordingContext, url: str, http: aiohttp.ClientSession
) -> None:
    body, headers = signed_form(
        slash_command("stop", channel="D5", user="U1", team_id=fake.team_id), fake.signing_secret
    )
    status, text = await post(http, url, body, headers)
    assert status == 200
    answer = json.loads(text)
    assert answer["response_type"] == "ephemeral" and "Stopping" in answer["text"]
    [req] = await rec.wait_requests(1)
    assert req.text == "/stop"


async def test_approval_button_over_http(
    fake: FakeSlack, rec: RecordingContext, url: str, http: aiohttp.ClientSession
) -> None:
    posted = await fake_post_prompt(fake, http)
    payload = block_action("botd_deny", "appr9", user="U1", channel="C1", team_id=fake.team_id,
                           message_ts=posted["ts"], message=posted["message"])  # fmt: skip
    body, headers = signed_interactive(payload, fake.signing_secret)
    assert (await post(http, url, body, headers))[0] == 200
    [req] = await rec.wait_requests(1)
    assert req.text == "/deny appr9"
    await fake.wait_calls("chat.update", 1)
    assert "Denied by <@U1>" in fake.messages[("C1", posted["ts"])]["text"]


async def fake_post_prompt(fake: FakeSlack, http: aiohttp.ClientSession) -> dict[str, Any]:
    blocks = [
        {"type": "section", "text": {"type": "mrkdwn", "text": "*Approval needed*"}},
        {"type": "actions", "elements": []},
    ]
    async with http.post(
        fake.api_url + "chat.postMessage",
        json={"channel": "C1", "text": "Approval needed", "blocks": blocks},
        headers={"Authorization": f"Bearer {fake.bot_token}"},
    ) as resp:
        data: dict[str, Any] = await resp.json()
    fake.calls.clear()
    return data


async def test_the_answer_waits_until_the_event_is_accepted(
    fake: FakeSlack, rec: RecordingContext, url: str, http: aiohttp.ClientSession
) -> None:
    gate = asyncio.Event()
    order: list[str] = []
    original = rec.submit

    async def slow_submit(request: RunRequest) -> SubmitResult:
        order.append("submit-started")
        await gate.wait()
        order.append("submit-done")
        return await original(request)

    rec.ctx.submit = slow_submit
    event = message_event("<@UBOT> slow", channel="C1", user="U1", ts="30.1", kind="app_mention")
    body, headers = signed_json(event_body(fake, event), fake.signing_secret)
    answer = asyncio.create_task(post(http, url, body, headers))
    while "submit-started" not in order:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    assert not answer.done()  # no 200 for an event that is not stored yet
    gate.set()
    status, _ = await asyncio.wait_for(answer, 3)
    order.append("http-answered")
    assert status == 200
    assert order == ["submit-started", "submit-done", "http-answered"]


async def test_event_not_accepted_is_503_and_slacks_retry_is_taken_once(
    fake: FakeSlack, rec: RecordingContext, url: str, http: aiohttp.ClientSession
) -> None:
    rec.refuse(2)  # the gateway answers "error" twice (Redis down), then takes it
    event = message_event("<@UBOT> keep me", channel="C1", user="U1", ts="32.1", kind="app_mention")
    body, headers = signed_json(event_body(fake, event, "EvDOWN"), fake.signing_secret)
    statuses = []
    for attempt in range(4):  # the first delivery, then Slack's retries
        retry = {"X-Slack-Retry-Num": str(attempt), "X-Slack-Retry-Reason": "http_error"} if attempt else {}
        status, text = await post(http, url, body, {**headers, **retry})
        statuses.append(status)
        if status == 503:
            assert json.loads(text)["ok"] is False
    assert statuses == [503, 503, 200, 200]
    assert len(rec.refused) == 2
    [req] = rec.requests
    assert req.text == "keep me"
    assert [o.status for _, o in rec.outcomes] == ["failed", "failed", "submitted", "duplicate"]


async def test_store_error_is_503(
    fake: FakeSlack, rec: RecordingContext, url: str, http: aiohttp.ClientSession
) -> None:
    rec.fail_submit = ConnectionError("Redis is down")
    event = message_event("hello", channel="D5", user="U1", ts="33.1", channel_type="im")
    body, headers = signed_json(event_body(fake, event, "EvRAISE"), fake.signing_secret)
    assert (await post(http, url, body, headers))[0] == 503
    rec.fail_submit = None
    retry = {**headers, "X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_error"}
    assert (await post(http, url, body, retry))[0] == 200
    assert [r.text for r in rec.requests] == ["hello"]


async def test_submit_slower_than_the_deadline_is_503_within_3_s(
    fake: FakeSlack, rec: RecordingContext, channel: SlackChannel, url: str, http: aiohttp.ClientSession
) -> None:
    channel.settings = dataclasses.replace(channel.settings, accept_timeout_s=0.5)
    gate = asyncio.Event()
    original = rec.submit

    async def stuck_submit(request: RunRequest) -> SubmitResult:
        await gate.wait()
        return await original(request)

    rec.ctx.submit = stuck_submit
    event = message_event("hello slow store", channel="D5", user="U1", ts="34.1", channel_type="im")
    body, headers = signed_json(event_body(fake, event, "EvSLOW"), fake.signing_secret)
    started = time.monotonic()
    status, _ = await post(http, url, body, headers)
    assert status == 503 and time.monotonic() - started < 1.5
    # The submit was not cut off: it finishes, and Slack's retry then finds it accepted.
    gate.set()
    await rec.wait_requests(1)
    await asyncio.sleep(0.1)
    retry = {**headers, "X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}
    assert (await post(http, url, body, retry))[0] == 200
    assert len(rec.requests) == 1


async def test_slash_command_not_accepted_is_503(
    fake: FakeSlack, rec: RecordingContext, url: str, http: aiohttp.ClientSession
) -> None:
    rec.refuse(1)
    fields = slash_command("stop", channel="D5", user="U1", team_id=fake.team_id)
    body, headers = signed_form(fields, fake.signing_secret)
    assert (await post(http, url, body, headers))[0] == 503
    status, text = await post(http, url, *signed_form(fields, fake.signing_secret))
    assert status == 200 and "Stopping" in json.loads(text)["text"]
    assert [r.text for r in rec.requests] == ["/stop"]


async def test_approval_button_not_accepted_is_503_and_leaves_the_prompt(
    fake: FakeSlack, rec: RecordingContext, url: str, http: aiohttp.ClientSession
) -> None:
    posted = await fake_post_prompt(fake, http)
    payload = block_action("botd_approve", "appr8", user="U1", channel="C1", team_id=fake.team_id,
                           message_ts=posted["ts"], message=posted["message"])  # fmt: skip
    rec.refuse(1)
    assert (await post(http, url, *signed_interactive(payload, fake.signing_secret)))[0] == 503
    assert rec.requests == [] and fake.calls_to("chat.update") == []
    assert (await post(http, url, *signed_interactive(payload, fake.signing_secret)))[0] == 200
    [req] = rec.requests
    assert req.text == "/approve appr8"
    await fake.wait_calls("chat.update", 1)


async def test_after_stop_the_route_answers_503(
    fake: FakeSlack, rec: RecordingContext, channel: SlackChannel, url: str, http: aiohttp.ClientSession
) -> None:
    await channel.stop()
    assert not channel.is_ready()
    event = message_event("<@UBOT> late", channel="C1", user="U1", ts="31.1", kind="app_mention")
    body, headers = signed_json(event_body(fake, event), fake.signing_secret)
    assert (await post(http, url, body, headers))[0] == 503
    assert rec.requests == []
