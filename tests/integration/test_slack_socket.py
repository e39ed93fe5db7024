"""The Slack channel over Socket Mode: slack-bolt and slack-sdk against the fake Slack."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from agent.types import RunRequest, SlackChat
from channels.base import ChannelAdapter, SubmitResult, Target
from channels.slack import SlackChannel, SlackSettings, SlackStartError
from tests.fakes.slack_context import RecordingContext, RedisKeyValue
from tests.fakes.slack_server import FakeSlack, block_action, message_event, slash_command


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


@pytest.fixture
def rec(redis_client: aioredis.Redis, redis_prefix: str) -> RecordingContext:
    return RecordingContext(RedisKeyValue(redis_client, redis_prefix))


def settings_for(fake: FakeSlack, **overrides: Any) -> SlackSettings:
    values: dict[str, Any] = {
        "bot_token": fake.bot_token,
        "app_token": fake.app_token,
        "mode": "socket",
        "api_base_url": fake.api_url,
        "allow_from": ("U1",),
        "channels": ("C1",),
    }
    values.update(overrides)
    return SlackSettings(**values)


@pytest.fixture
async def channel(fake: FakeSlack, rec: RecordingContext) -> AsyncIterator[SlackChannel]:
    ch = SlackChannel(settings_for(fake), observer=rec.observe)
    await ch.start(rec.ctx)
    await fake.wait_connected()
    try:
        yield ch
    finally:
        await ch.stop()


async def test_connects_through_apps_connections_open(fake: FakeSlack, channel: SlackChannel) -> None:
    assert isinstance(channel, ChannelAdapter)
    assert channel.is_ready()
    [opened] = fake.calls_to("apps.connections.open")
    assert opened.token == fake.app_token
    assert channel.identity.user_id == fake.bot_user_id
    assert fake.calls_to("auth.test")[0].token == fake.bot_token


async def test_app_mention_is_acked_and_submitted_with_thread_session(
    fake: FakeSlack, rec: RecordingContext, channel: SlackChannel
) -> None:
    envelope = await fake.push_event(
        message_event("<@UBOT> summarize this", channel="C1", user="U1", ts="111.1", kind="app_mention")
    )
    ack = await fake.wait_ack(envelope)
    assert ack == {"envelope_id": envelope}
    [req] = await rec.wait_requests(1)
    assert req.session_key == "agent:main:slack:channel:C1:thread:111.1"
    assert (req.chat_id, req.thread_id, req.reply_to, req.text) == ("C1", "111.1", "111.1", "summarize this")
    assert isinstance(req.chat, SlackChat) and req.chat.team == fake.team_id


async def test_dm_and_thread_follow_up(fake: FakeSlack, rec: RecordingContext, channel: SlackChannel) -> None:
    await fake.push_event(message_event("hello", channel="D5", user="U1", ts="1.1", channel_type="im"))
    await fake.push_event(
        message_event("<@UBOT> start", channel="C1", user="U1", ts="2.1", kind="app_mention")
    )
    await rec.wait_requests(2)
    await fake.push_event(message_event("follow-up", channel="C1", user="U1", ts="2.2", thread_ts="2.1"))
    reqs = await rec.wait_requests(3)
    by_text = {r.text: r for r in reqs}
    assert by_text["hello"].session_key == "agent:main:slack:dm:U1"
    assert by_text["hello"].chat_id == "D5"
    assert by_text["follow-up"].session_key == by_text["start"].session_key


async def test_twins_and_retries_submit_once(
    fake: FakeSlack, rec: RecordingContext, channel: SlackChannel
) -> None:
    post = {"channel": "C1", "user": "U1", "ts": "3.1"}
    first = await fake.push_event(message_event("<@UBOT> twin", **post), event_id="EvA")
    twin = await fake.push_event(message_event("<@UBOT> twin", kind="app_mention", **post), event_id="EvB")
    await fake.wait_ack(first)
    await fake.wait_ack(twin)
    retry = await fake.push_event(
        message_event("<@UBOT> twin", kind="app_mention", **post), event_id="EvB", retry_attempt=1
    )
    await fake.wait_ack(retry)
    outcomes = await rec.wait_outcomes(3)
    assert sorted(o.status for _, o in outcomes) == ["duplicate", "duplicate", "submitted"]
    assert len(rec.requests) == 1


@pytest.mark.parametrize("text", ["stop", "!stop", "<@UBOT> stop"])
async def test_stop_words(fake: FakeSlack, rec: RecordingContext, channel: SlackChannel, text: str) -> None:
    await fake.push_event(
        message_event("<@UBOT> long job", channel="C1", user="U1", ts="4.1", kind="app_mention")
    )
    await rec.wait_requests(1)
    await fake.push_event(message_event(text, channel="C1", user="U1", ts="4.2", thread_ts="4.1"))
    reqs = await rec.wait_requests(2)
    assert reqs[1].text == "/stop"
    assert reqs[1].session_key == reqs[0].session_key


async def test_slash_command_is_acked_ephemerally_then_submitted(
    fake: FakeSlack, rec: RecordingContext, channel: SlackChannel
) -> None:
    envelope = await fake.send_envelope(
        "slash_commands", slash_command("stop", channel="D5", user="U1", team_id=fake.team_id)
    )
    ack = await fake.wait_ack(envelope)
    assert ack["payload"]["response_type"] == "ephemeral"
    assert "Stopping" in ack["payload"]["text"]
    [req] = await rec.wait_requests(1)
    assert (req.text, req.session_key) == ("/stop", "agent:main:slack:dm:U1")


async def test_slash_command_from_stranger_is_refused(
    fake: FakeSlack, rec: RecordingContext, channel: SlackChannel
) -> None:
    envelope = await fake.send_envelope(
        "slash_commands", slash_command("stop", channel="D5", user="U666", team_id=fake.team_id)
    )
    ack = await fake.wait_ack(envelope)
    assert "not allowed" in ack["payload"]["text"]
    [(kind, outcome)] = await rec.wait_outcomes(1)
    assert (kind, outcome.status) == ("command", "denied")
    assert rec.requests == []


@pytest.mark.parametrize(
    "event",
    [
        message_event("edit", channel="C1", user="U1", ts="5.1", subtype="message_changed"),
        message_event("<@UBOT> from a bot", channel="C1", user="U2", ts="5.2", bot_id="B2"),
        message_event("<@UBOT> mine", channel="C1", user="UBOT", ts="5.3"),
        message_event("<@UBOT> hi", channel="C1", user="U666", ts="5.4", kind="app_mention"),
        message_event("<@UBOT> hi", channel="C999", user="U1", ts="5.5", kind="app_mention"),
    ],
)
async def test_ignored_and_unauthorized_events_never_submit(
    fake: FakeSlack, rec: RecordingContext, channel: SlackChannel, event: dict[str, Any]
) -> None:
    envelope = await fake.push_event(event)
    await fake.wait_ack(envelope)
    # the bot's own events stop in bolt's middleware; everything else reaches the intake
    if event.get("user") != "UBOT":
        [(_, outcome)] = await rec.wait_outcomes(1)
        assert outcome.status in ("ignored", "denied")
    await asyncio.sleep(0.05)
    assert rec.requests == []


async def test_inbound_concurrency_is_bounded(fake: FakeSlack, rec: RecordingContext) -> None:
    gate = asyncio.Event()
    two_started = asyncio.Event()
    started: list[str] = []
    record = rec.submit

    async def gated_submit(request: RunRequest) -> SubmitResult:
        started.append(request.text)
        if len(started) >= 2:
            two_started.set()
        await gate.wait()
        return await record(request)

    rec.ctx.submit = gated_submit
    ch = SlackChannel(settings_for(fake, max_concurrent_intake=2), observer=rec.observe)
    await ch.start(rec.ctx)
    await fake.wait_connected()
    try:
        envelopes = [
            await fake.push_event(
                message_event(f"m{i}", channel="D5", user="U1", ts=f"20.{i}", channel_type="im")
            )
            for i in range(5)
        ]
        await asyncio.wait_for(two_started.wait(), 5)
        await asyncio.sleep(0.1)
        assert len(started) == 2
        assert not any(e in fake.acks for e in envelopes)  # none acked before it is accepted
        gate.set()
        for envelope in envelopes:
            await fake.wait_ack(envelope)
        assert len(await rec.wait_requests(5)) == 5
    finally:
        await ch.stop()


async def test_event_not_accepted_is_not_acked_and_its_redelivery_is(
    fake: FakeSlack, rec: RecordingContext, channel: SlackChannel
) -> None:
    rec.refuse(1)  # the gateway answers "error" once (Redis down), then takes it
    event = message_event("<@UBOT> keep me", channel="C1", user="U1", ts="12.1", kind="app_mention")
    first = await fake.push_event(event, event_id="EvDOWN")
    [(_, outcome)] = await rec.wait_outcomes(1)
    assert outcome.status == "failed"
    await asyncio.sleep(0.2)
    assert first not in fake.acks  # Slack redelivers an envelope that is not acked
    again = await fake.push_event(event, event_id="EvDOWN", retry_attempt=1)
    assert await fake.wait_ack(again) == {"envelope_id": again}
    [req] = await rec.wait_requests(1)
    assert req.text == "keep me"
    assert len(rec.refused) == 1
    assert first not in fake.acks


async def test_store_error_leaves_the_envelope_unacked(
    fake: FakeSlack, rec: RecordingContext, channel: SlackChannel
) -> None:
    rec.fail_submit = ConnectionError("Redis is down")
    event = message_event("hello", channel="D5", user="U1", ts="12.2", channel_type="im")
    first = await fake.push_event(event, event_id="EvRAISE")
    await rec.wait_outcomes(1)
    rec.fail_submit = None
    again = await fake.push_event(event, event_id="EvRAISE", retry_attempt=1)
    await fake.wait_ack(again)
    assert first not in fake.acks
    assert [r.text for r in await rec.wait_requests(1)] == ["hello"]


async def test_slash_command_not_accepted_is_not_acked(
    fake: FakeSlack, rec: RecordingContext, channel: SlackChannel
) -> None:
    rec.refuse(1)
    fields = slash_command("stop", channel="D5", user="U1", team_id=fake.team_id)
    refused = await fake.send_envelope("slash_commands", fields)
    await rec.wait_outcomes(1)
    await asyncio.sleep(0.2)
    assert refused not in fake.acks and rec.requests == []
    ack = await fake.wait_ack(await fake.send_envelope("slash_commands", fields))
    assert "Stopping" in ack["payload"]["text"]
    assert [r.text for r in rec.requests] == ["/stop"]


async def test_approval_prompt_and_button_press(
    fake: FakeSlack, rec: RecordingContext, channel: SlackChannel
) -> None:
    target = Target(channel="slack", chat_id="C1", thread_id="6.1", reply_to="6.1")
    await channel.ask_approval(target, "appr7", 'bash {"cmd": "rm -rf <!channel>"}')
    [prompt] = fake.calls_to("chat.postMessage")
    assert prompt.args["thread_ts"] == "6.1"
    buttons = prompt.args["blocks"][1]["elements"]
    assert [(b["action_id"], b["value"]) for b in buttons] == [
        ("botd_approve", "appr7"),
        ("botd_deny", "appr7"),
    ]
    assert "<!channel>" not in prompt.args["blocks"][0]["text"]["text"]
    ts = next(iter(fake.messages))[1]

    stranger = block_action("botd_approve", "appr7", user="U666", channel="C1", team_id=fake.team_id,
                            message_ts=ts, thread_ts="6.1", message=fake.messages[("C1", ts)])  # fmt: skip
    await fake.wait_ack(await fake.send_envelope("interactive", stranger))
    [(_, ignored)] = await rec.wait_outcomes(1)
    assert ignored.status == "ignored"
    assert rec.requests == [] and fake.calls_to("chat.update") == []

    press = block_action("botd_approve", "appr7", user="U1", channel="C1", team_id=fake.team_id,
                         message_ts=ts, thread_ts="6.1", message=fake.messages[("C1", ts)])  # fmt: skip
    await fake.wait_ack(await fake.send_envelope("interactive", press))
    [req] = await rec.wait_requests(1)
    assert req.text == "/approve appr7"
    assert req.session_key == "agent:main:slack:channel:C1:thread:6.1"
    [_update] = await fake.wait_calls("chat.update", 1)
    decided = fake.messages[("C1", ts)]
    assert "Approved by <@U1>" in decided["text"]
    assert all(block["type"] != "actions" for block in decided["blocks"])


async def test_reply_stream_through_the_channel(fake: FakeSlack, channel: SlackChannel) -> None:
    target = Target(channel="slack", chat_id="C1", thread_id="7.1", reply_to="7.1")
    stream = channel.open_stream(target, "run-7")
    await stream.start()
    await stream.preview("Working on **it**")
    await fake.wait_calls("chat.postMessage", 1)
    parts = channel.format_parts("Done: **all good** <!channel>")
    assert parts == ["Done: *all good* &lt;!channel&gt;"]
    ts = await stream.deliver(0, parts[0])
    await stream.close()
    assert fake.messages[("C1", str(ts))]["text"] == parts[0]
    assert [c.method for c in fake.calls if c.method.startswith(("chat.", "reactions."))] == [
        "reactions.add", "chat.postMessage", "chat.update", "reactions.remove",
    ]  # fmt: skip


async def test_send_text_splits_long_text_in_the_thread(fake: FakeSlack, channel: SlackChannel) -> None:
    target = Target(channel="slack", chat_id="C1", thread_id="8.1")
    text = "\n\n".join(f"Part {i}: " + "lorem ipsum " * 80 for i in range(15))
    first = await channel.send_text(target, text)
    posts = fake.calls_to("chat.postMessage")
    assert len(posts) >= 3
    assert all(len(p.args["text"]) <= 4000 and p.args["thread_ts"] == "8.1" for p in posts)
    assert first == sorted(ts for _, ts in fake.messages)[0]


async def test_stop_closes_the_socket(fake: FakeSlack, rec: RecordingContext) -> None:
    ch = SlackChannel(settings_for(fake), observer=rec.observe)
    await ch.start(rec.ctx)
    await fake.wait_connected()
    await ch.stop()
    assert not ch.is_ready()
    await fake.wait_for(lambda: not fake.connected)


async def test_reconnects_when_slack_asks(
    fake: FakeSlack, rec: RecordingContext, channel: SlackChannel
) -> None:
    await fake.send_disconnect()
    await fake.wait_for(lambda: fake.socket_connections >= 2 and fake.connected, within=10)
    await fake.push_event(
        message_event("after reconnect", channel="D5", user="U1", ts="9.1", channel_type="im")
    )
    [req] = await rec.wait_requests(1)
    assert req.text == "after reconnect"


async def test_bad_tokens_fail_start_with_a_clear_error(fake: FakeSlack, rec: RecordingContext) -> None:
    with pytest.raises(SlackStartError, match=re.escape("invalid_auth (check slack.bot_token)")):
        await SlackChannel(settings_for(fake, bot_token="xoxb-nope")).start(rec.ctx)
    with pytest.raises(SlackStartError, match=re.escape("invalid_auth (check slack.app_token)")):
        await SlackChannel(settings_for(fake, app_token="xapp-nope")).start(rec.ctx)
    fake.fail("auth.test", "service_unavailable", status=503, times=10)
    with pytest.raises(SlackStartError, match=re.escape("service_unavailable (is the Slack API")):
        await SlackChannel(settings_for(fake, api_max_retries=1)).start(rec.ctx)


async def test_start_returns_unready_when_the_socket_refuses_and_recovers(
    fake: FakeSlack, rec: RecordingContext
) -> None:
    fake.refuse_sockets = True
    ch = SlackChannel(
        settings_for(fake, connect_timeout_s=0.3, socket_ping_interval_s=0.2), observer=rec.observe
    )
    await ch.start(rec.ctx)
    try:
        assert not ch.is_ready()
        fake.refuse_sockets = False
        await fake.wait_connected(within=10)
        await fake.push_event(
            message_event("late hello", channel="D5", user="U1", ts="10.1", channel_type="im")
        )
        [req] = await rec.wait_requests(1)
        assert req.text == "late hello"
        assert ch.is_ready()
    finally:
        await ch.stop()
    assert not ch.is_ready()
