"""Event normalization, access and dedupe (SlackIntake, CommandIntake) over real Redis."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis

from agent.types import SlackChat
from channels.base import KeyWrite
from channels.slack.access import AccessPolicy
from channels.slack.commands import CommandIntake
from channels.slack.intake import BotIdentity, SlackIntake
from tests.fakes.slack_context import RecordingContext, RedisKeyValue
from tests.fakes.slack_server import block_action, event_callback, message_event, slash_command
from tests.fakes.store_requests import StoreRequests

TEAM = "T0FAKE"
ME = BotIdentity(team_id=TEAM, user_id="UBOT", bot_id="BBOT")


@pytest.fixture
def rec(redis_client: aioredis.Redis, redis_prefix: str) -> RecordingContext:
    return RecordingContext(RedisKeyValue(redis_client, redis_prefix))


def make_intake(
    rec: RecordingContext,
    *,
    allow_from: tuple[str, ...] = ("U1",),
    channels: tuple[str, ...] = ("C1",),
    require_mention: bool = True,
) -> SlackIntake:
    return SlackIntake(rec.ctx, ME, AccessPolicy.of(allow_from, channels), require_mention=require_mention)


def body(event: dict[str, Any], event_id: str | None = None) -> dict[str, Any]:
    return event_callback(event, team_id=TEAM, event_id=event_id)


def mention(text: str, ts: str, **kw: Any) -> dict[str, Any]:
    kw.setdefault("channel", "C1")
    kw.setdefault("user", "U1")
    return message_event(text, ts=ts, kind="app_mention", **kw)


async def test_top_level_mention_starts_a_thread_session(rec: RecordingContext) -> None:
    intake = make_intake(rec)
    outcome = await intake.on_event(body(mention("<@UBOT> hello there", "100.1")))
    assert outcome.status == "submitted"
    [req] = rec.requests
    assert req.session_key == "agent:main:slack:channel:C1:thread:100.1"
    assert (req.channel, req.chat_id, req.thread_id, req.reply_to) == ("slack", "C1", "100.1", "100.1")
    assert req.text == "hello there"
    assert req.user_id == "U1"
    assert req.dedupe_key == f"slack:{TEAM}:C1:100.1"
    assert req.chat == SlackChat(team=TEAM, scope="channel")
    assert await rec.kv.get("slack:thread:C1:100.1") == "1"
    assert 6 * 86400 < await rec.kv.ttl("slack:thread:C1:100.1") <= 7 * 86400


async def test_thread_follow_up_without_mention_joins_the_session(rec: RecordingContext) -> None:
    intake = make_intake(rec)
    await intake.on_event(body(mention("<@UBOT> start", "100.1")))
    reply = message_event("and more", channel="C1", user="U1", ts="100.2", thread_ts="100.1")
    assert (await intake.on_event(body(reply))).status == "submitted"
    first, second = rec.requests
    assert second.session_key == first.session_key
    assert (second.thread_id, second.reply_to, second.text) == ("100.1", "100.2", "and more")


async def test_reply_in_a_thread_the_bot_is_not_in_is_ignored(rec: RecordingContext) -> None:
    intake = make_intake(rec)
    reply = message_event("chatter", channel="C1", user="U1", ts="200.2", thread_ts="200.1")
    outcome = await intake.on_event(body(reply))
    assert (outcome.status, outcome.reason) == ("ignored", "thread_not_joined")
    assert rec.requests == []


async def test_mention_inside_a_thread_uses_the_thread_root(rec: RecordingContext) -> None:
    intake = make_intake(rec)
    await intake.on_event(body(mention("<@UBOT> help here", "300.5", thread_ts="300.1")))
    [req] = rec.requests
    assert req.session_key.endswith(":thread:300.1")
    assert (req.thread_id, req.reply_to) == ("300.1", "300.5")
    # now the bot is in that thread: a plain reply joins
    await intake.on_event(
        body(message_event("thanks", channel="C1", user="U1", ts="300.6", thread_ts="300.1"))
    )
    assert len(rec.requests) == 2


async def test_dm_is_keyed_by_user_and_replies_to_the_dm_channel(rec: RecordingContext) -> None:
    intake = make_intake(rec, channels=())
    dm = message_event("hi bot", channel="D9", user="U1", ts="400.1", channel_type="im")
    assert (await intake.on_event(body(dm))).status == "submitted"
    [req] = rec.requests
    assert req.session_key == "agent:main:slack:dm:U1"
    assert (req.chat_id, req.thread_id, req.reply_to) == ("D9", None, "400.1")
    assert isinstance(req.chat, SlackChat) and req.chat.scope == "dm"


async def test_dm_inside_a_thread_replies_in_that_thread(rec: RecordingContext) -> None:
    intake = make_intake(rec)
    dm = message_event("more", channel="D9", user="U1", ts="400.3", channel_type="im", thread_ts="400.1")
    await intake.on_event(body(dm))
    [req] = rec.requests
    assert req.session_key == "agent:main:slack:dm:U1"
    assert req.thread_id == "400.1"


async def test_twin_message_and_app_mention_submit_once(rec: RecordingContext) -> None:
    intake = make_intake(rec)
    twin_message = message_event("<@UBOT> twins", channel="C1", user="U1", ts="500.1")
    twin_mention = mention("<@UBOT> twins", "500.1")
    first = await intake.on_event(body(twin_message))
    second = await intake.on_event(body(twin_mention))
    assert first.status == "submitted"
    assert second.status == "duplicate"
    assert len(rec.requests) == 1


async def test_retried_event_id_submits_once(rec: RecordingContext) -> None:
    intake = make_intake(rec)
    event = mention("<@UBOT> once", "600.1")
    assert (await intake.on_event(body(event, "EvRETRY1"))).status == "submitted"
    again = await intake.on_event(body(event, "EvRETRY1"))
    assert (again.status, again.accepted) == ("duplicate", True)
    assert len(rec.requests) == 1


@pytest.mark.parametrize("word", ["stop", "!stop", "STOP", "  !Stop  "])
async def test_stop_word_in_a_thread_becomes_stop_command(rec: RecordingContext, word: str) -> None:
    intake = make_intake(rec)
    await intake.on_event(body(mention("<@UBOT> long job", "700.1")))
    await intake.on_event(body(message_event(word, channel="C1", user="U1", ts="700.2", thread_ts="700.1")))
    assert rec.requests[-1].text == "/stop"
    assert rec.requests[-1].session_key == rec.requests[0].session_key


async def test_top_level_mention_stop_targets_the_last_thread(rec: RecordingContext) -> None:
    intake = make_intake(rec)
    await intake.on_event(body(mention("<@UBOT> long job", "800.1")))
    await intake.on_event(body(mention("<@UBOT> stop", "800.9")))
    stop = rec.requests[-1]
    assert stop.text == "/stop"
    assert stop.session_key == rec.requests[0].session_key
    assert stop.thread_id == "800.1"
    # a stop does not become a thread of its own
    assert await rec.kv.get("slack:thread:C1:800.9") is None


async def test_dm_stop(rec: RecordingContext) -> None:
    intake = make_intake(rec)
    await intake.on_event(body(message_event("!stop", channel="D9", user="U1", ts="1.1", channel_type="im")))
    assert rec.requests[0].text == "/stop"
    assert rec.requests[0].session_key == "agent:main:slack:dm:U1"


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (
            message_event("edited", channel="C1", user="U1", ts="9.1", subtype="message_changed"),
            "subtype:message_changed",
        ),
        (
            message_event("", channel="C1", user="U1", ts="9.2", subtype="message_deleted"),
            "subtype:message_deleted",
        ),
        (
            message_event("joined", channel="C1", user="U1", ts="9.3", subtype="channel_join"),
            "subtype:channel_join",
        ),
        (
            message_event("<@UBOT> beep", channel="C1", user="U1", ts="9.4", subtype="bot_message"),
            "subtype:bot_message",
        ),
        (message_event("<@UBOT> beep", channel="C1", user="U2", ts="9.5", bot_id="B2"), "bot"),
        (message_event("<@UBOT> me", channel="C1", user="UBOT", ts="9.6"), "self"),
        (message_event("just chatting", channel="C1", user="U1", ts="9.7"), "not_addressed"),
        (mention("<@UBOT>", "9.8"), "empty"),
        ({"type": "reaction_added", "user": "U1"}, "event:reaction_added"),
    ],
)
async def test_ignored_events(rec: RecordingContext, event: dict[str, Any], reason: str) -> None:
    outcome = await make_intake(rec).on_event(body(event))
    assert (outcome.status, outcome.reason) == ("ignored", reason)
    assert rec.requests == []


async def test_malformed_event_is_ignored(rec: RecordingContext) -> None:
    intake = make_intake(rec)
    assert (await intake.on_event({"type": "event_callback"})).reason == "no_event"
    bad = mention("<@UBOT> hi", "1.1", channel="C1:x y")
    assert (await intake.on_event(body(bad))).reason == "malformed"
    assert rec.requests == []


@pytest.mark.parametrize(
    ("allow_from", "channels", "event"),
    [
        (("U1",), ("C1",), mention("<@UBOT> hi", "1.1", user="USTRANGER")),
        (("U1",), ("C1",), mention("<@UBOT> hi", "1.1", channel="COTHER")),
        ((), ("C1",), mention("<@UBOT> hi", "1.1")),
        (("U1",), (), mention("<@UBOT> hi", "1.1")),
        (("U1",), ("*",), message_event("hi", channel="D9", user="U2", ts="1.1", channel_type="im")),
        ((), ("*",), message_event("hi", channel="D9", user="U1", ts="1.1", channel_type="im")),
    ],
)
async def test_unauthorized_is_denied_without_submit(
    rec: RecordingContext, allow_from: tuple[str, ...], channels: tuple[str, ...], event: dict[str, Any]
) -> None:
    outcome = await make_intake(rec, allow_from=allow_from, channels=channels).on_event(
        body(event, "EvDENIED")
    )
    assert outcome.status == "denied"
    assert rec.requests == []
    assert await rec.kv.get("slack:event:EvDENIED") is None


async def test_wildcards_admit_anyone(rec: RecordingContext) -> None:
    intake = make_intake(rec, allow_from=("*",), channels=("*",))
    assert (
        await intake.on_event(body(mention("<@UBOT> hi", "1.1", user="UANY", channel="CANY")))
    ).status == "submitted"


async def test_require_mention_off_admits_plain_channel_messages(rec: RecordingContext) -> None:
    intake = make_intake(rec, require_mention=False)
    outcome = await intake.on_event(body(message_event("plain talk", channel="C1", user="U1", ts="11.1")))
    assert outcome.status == "submitted"
    assert rec.requests[0].session_key.endswith(":thread:11.1")


async def test_inbound_markup_is_resolved(rec: RecordingContext) -> None:
    await make_intake(rec).on_event(
        body(mention("<@UBOT> is 1 &lt; 2 &amp;&amp; <https://x.io|x.io>?", "12.1"))
    )
    assert rec.requests[0].text == "is 1 < 2 && https://x.io?"


async def test_failed_submit_releases_dedupe_keys(rec: RecordingContext) -> None:
    intake = make_intake(rec)
    rec.fail_submit = ConnectionError("store down")
    event = mention("<@UBOT> hi", "13.1")
    outcome = await intake.on_event(body(event, "EvFAIL"))
    assert (outcome.status, outcome.reason) == ("failed", "ConnectionError")
    rec.fail_submit = None
    assert (await intake.on_event(body(event, "EvFAIL"))).status == "submitted"
    assert len(rec.requests) == 1


async def test_refused_submit_is_not_accepted_and_the_retry_is_taken(rec: RecordingContext) -> None:
    intake = make_intake(rec)
    rec.refuse(2)
    event = mention("<@UBOT> hi", "13.2")
    for _ in range(2):  # the gateway answers "error": not accepted, and the claim is freed
        outcome = await intake.on_event(body(event, "EvREFUSED"))
        assert (outcome.status, outcome.reason, outcome.accepted) == ("failed", "store unavailable", False)
    retried = await intake.on_event(body(event, "EvREFUSED"))
    assert (retried.status, retried.accepted) == ("submitted", True)
    assert len(rec.refused) == 2 and len(rec.requests) == 1
    assert (await intake.on_event(body(event, "EvREFUSED"))).status == "duplicate"


async def test_store_down_for_the_thread_memory_is_not_accepted(rec: RecordingContext) -> None:
    class DownKeyValue:
        async def set_many(self, writes: Sequence[KeyWrite]) -> None:
            raise ConnectionError("Redis is down")

    intake = make_intake(rec)
    real_kv = rec.ctx.kv
    rec.ctx.kv = DownKeyValue()  # type: ignore[assignment]
    event = mention("<@UBOT> hi", "13.3")
    outcome = await intake.on_event(body(event, "EvDOWN"))
    assert (outcome.status, outcome.accepted) == ("failed", False)
    rec.ctx.kv = real_kv
    assert (await intake.on_event(body(event, "EvDOWN"))).status == "submitted"
    assert len(rec.requests) == 1


async def test_a_stop_word_retried_while_it_is_handled_is_not_accepted_yet(rec: RecordingContext) -> None:
    intake = make_intake(rec)
    event = message_event("stop", channel="D5", user="U1", ts="13.4", channel_type="im")
    claim = await rec.dedupe.claim(f"slack:{TEAM}:D5:13.4")  # the first delivery, still being handled
    again = await intake.on_event(body(event, "EvSTOP"))
    assert (again.status, again.accepted) == ("failed", False)  # Slack retries later
    await rec.dedupe.release(claim)  # the first delivery failed: the retry is taken
    assert (await intake.on_event(body(event, "EvSTOP"))).status == "submitted"
    assert (await intake.on_event(body(event, "EvSTOP"))).status == "duplicate"
    assert [r.text for r in rec.requests] == ["/stop"]


# -- slash command and approval buttons -------------------------------------------------------


def commands(rec: RecordingContext, allow_from: tuple[str, ...] = ("U1",)) -> CommandIntake:
    return CommandIntake(rec.ctx, AccessPolicy.of(allow_from, ("C1",)), TEAM)


@pytest.mark.parametrize(
    ("word", "control"),
    [
        ("stop", "/stop"),
        ("stopall", "/stopall"),
        ("new", "/new"),
        ("status", "/status"),
        ("help", "/help"),
        ("", "/help"),
        ("compact", "/compact"),
        ("compact  keep the  decisions", "/compact keep the decisions"),
        ("model", "/model"),
        ("MODEL gpt-4o", "/model gpt-4o"),
        ("usage", "/usage"),
    ],
)
async def test_slash_command_maps_to_control(rec: RecordingContext, word: str, control: str) -> None:
    cmd = commands(rec)
    plan = cmd.plan_command(slash_command(word, channel="D9", user="U1", team_id=TEAM))
    assert plan.control == control and plan.ack_text
    await cmd.run_command(plan)
    [req] = rec.requests
    assert (req.text, req.session_key, req.chat_id) == (control, "agent:main:slack:dm:U1", "D9")
    assert req.dedupe_key is not None and req.dedupe_key.startswith(f"slack:{TEAM}:command:")


async def test_slash_stop_in_a_channel_targets_the_users_last_thread(rec: RecordingContext) -> None:
    await make_intake(rec).on_event(body(mention("<@UBOT> long job", "900.1")))
    cmd = commands(rec)
    await cmd.run_command(cmd.plan_command(slash_command("stop", channel="C1", user="U1", team_id=TEAM)))
    stop = rec.requests[-1]
    assert stop.text == "/stop"
    assert stop.session_key == rec.requests[0].session_key
    assert stop.thread_id == "900.1"


async def test_slash_command_refusals(rec: RecordingContext) -> None:
    cmd = commands(rec)
    unknown = cmd.plan_command(slash_command("dance", channel="C1", user="U1", team_id=TEAM))
    assert (unknown.control, unknown.rejected) == (None, "unknown")
    assert "Usage" in unknown.ack_text
    for text in ("stop now", "model a b", "usage please", "compact " + "x" * 600):
        extra = cmd.plan_command(slash_command(text, channel="C1", user="U1", team_id=TEAM))
        assert (extra.control, extra.rejected) == (None, "unknown"), text
    stranger = cmd.plan_command(slash_command("stop", channel="C1", user="U666", team_id=TEAM))
    assert (stranger.control, stranger.rejected) == (None, "denied")
    assert await cmd.run_command(stranger) is None
    assert rec.requests == []


async def test_approval_button_from_allowed_user(rec: RecordingContext) -> None:
    cmd = commands(rec)
    payload = block_action(
        "botd_approve", "appr42", user="U1", channel="C1", team_id=TEAM, message_ts="50.5", thread_ts="50.1"
    )
    answer = cmd.parse_approval(payload)
    assert answer is not None and answer.decision == "approve"
    await cmd.submit_approval(answer)
    [req] = rec.requests
    assert req.text == "/approve appr42"
    assert req.session_key == "agent:main:slack:channel:C1:thread:50.1"
    assert (req.chat_id, req.user_id) == ("C1", "U1")
    assert req.dedupe_key == f"slack:{TEAM}:action:{payload['trigger_id']}"


async def test_deny_button_and_refusals(rec: RecordingContext) -> None:
    cmd = commands(rec)
    deny = cmd.parse_approval(
        block_action("botd_deny", "a1", user="U1", channel="C1", team_id=TEAM, message_ts="5.5")
    )
    assert deny is not None and deny.decision == "deny"
    assert (
        cmd.parse_approval(
            block_action("botd_deny", "a1", user="U666", channel="C1", team_id=TEAM, message_ts="5.5")
        )
        is None
    )
    assert (
        cmd.parse_approval(
            block_action("botd_deny", "a b!", user="U1", channel="C1", team_id=TEAM, message_ts="5.5")
        )
        is None
    )
    assert (
        cmd.parse_approval(
            block_action("other", "a1", user="U1", channel="C1", team_id=TEAM, message_ts="5.5")
        )
        is None
    )
    assert cmd.parse_approval({"type": "block_actions"}) is None


async def test_thread_bookkeeping_of_a_mention_is_one_round_trip(
    rec: RecordingContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    intake = make_intake(rec)
    requests = StoreRequests(monkeypatch)
    await intake.on_event(body(mention("<@UBOT> hello", "300.1")))
    [write] = requests.touching(":kv:slack:")  # the thread and the person's last thread together
    assert b"slack:thread:C1:300.1" in write and b"slack:last_thread:C1:U1" in write
    assert await rec.kv.get("slack:last_thread:C1:U1") == "300.1"
    assert 6 * 86400 < await rec.kv.ttl("slack:thread:C1:300.1") <= 7 * 86400
    assert 23 * 3600 < await rec.kv.ttl("slack:last_thread:C1:U1") <= 24 * 3600
