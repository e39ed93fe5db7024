"""The Slack event normalizer (SlackIntake.on_event) under hostile envelopes, over real Redis.

Whatever the body, ``on_event`` answers an Outcome and never raises; only allowed people
in allowed places get a submit, at most one per event; and a valid DM, mention or thread
reply is submitted exactly once with its text intact.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from channels.slack.access import AccessPolicy
from channels.slack.intake import BotIdentity, Outcome, SlackIntake
from tests.fakes.slack_context import RecordingContext, RedisKeyValue
from tests.fakes.slack_server import event_callback, message_event
from tests.fuzz.strategies import hostile_text, json_values, mutate, text_without

TEAM = "T0FAKE"
ME = BotIdentity(team_id=TEAM, user_id="UBOT", bot_id="BBOT")
POLICY = AccessPolicy.of(("U1",), ("C1",))
_ts = itertools.count(1)

_KEYS = st.sampled_from(["type", "subtype", "user", "text", "ts", "thread_ts", "channel", "channel_type", "bot_id",
                         "bot_profile", "event", "event_id", "team_id", "team", "edited", "message", "files"])
_SUBTYPES = ["", "thread_broadcast", "file_share", "me_message", "message_changed", "message_deleted",
             "bot_message", "channel_join", None, 5, ["x"]]


def _fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def _next_ts() -> str:
    return f"{1700000000 + next(_ts)}.{uuid.uuid4().int % 10**6:06d}"


def _rec(client: aioredis.Redis) -> RecordingContext:
    return RecordingContext(RedisKeyValue(client, f"fz{uuid.uuid4().hex[:10]}"))


def _intake(rec: RecordingContext, require_mention: bool = True) -> SlackIntake:
    return SlackIntake(rec.ctx, ME, POLICY, require_mention=require_mention)


@st.composite
def envelopes(draw: st.DrawFn) -> dict[str, Any]:
    """Event envelopes as Slack sends them: DMs, mentions, channel messages, thread replies, subtypes."""
    text = draw(hostile_text)
    user = draw(st.sampled_from(["U1", "U2", "UBOT", ""]))
    channel = draw(st.sampled_from(["C1", "C2", "D1", "G1"]))
    ts = _next_ts()
    kind = draw(st.sampled_from(["dm", "mention", "message", "thread", "subtype"]))
    if kind == "dm":
        event_ = message_event(text, channel="D1", user=user, ts=ts, channel_type="im")
    elif kind == "mention":
        event_ = message_event(f"<@UBOT> {text}", channel=channel, user=user, ts=ts, kind="app_mention")
    elif kind == "message":
        event_ = message_event(text, channel=channel, user=user, ts=ts)
    elif kind == "thread":
        event_ = message_event(text, channel=channel, user=user, ts=ts, thread_ts=draw(st.sampled_from([ts, "1.1"])))
    else:
        event_ = message_event(text, channel=channel, user=user, ts=ts, subtype=draw(st.sampled_from(_SUBTYPES)))
    return event_callback(event_, team_id=TEAM, event_id=f"Ev{uuid.uuid4().hex[:12]}")


async def _on_event(intake: SlackIntake, rec: RecordingContext, body: dict[str, Any]) -> Outcome:
    before = len(rec.requests)
    outcome = await intake.on_event(body)
    assert isinstance(outcome, Outcome)
    new = rec.requests[before:]
    event(f"{outcome.status}")
    if outcome.status == "submitted":
        [request] = new
        assert request.text and request.text == request.text.strip()
        assert request.user_id == "U1"
        assert request.chat_id == "C1" or request.session_key.startswith("agent:main:slack:dm:")
    else:
        assert new == []
    return outcome


@_fuzz(400)
@given(data=st.data())
async def test_mutated_envelopes_never_raise(redis_client: aioredis.Redis, data: st.DataObject) -> None:
    rec = _rec(redis_client)
    intake = _intake(rec, require_mention=data.draw(st.booleans()))
    body = mutate(data.draw(envelopes()), data.draw, keys=_KEYS)
    outcome = await _on_event(intake, rec, body)
    # A redelivery of the same body never submits again.
    if outcome.status == "submitted":
        again = await intake.on_event(body)
        assert again.status == "duplicate" and len(rec.requests) == 1


@_fuzz(200)
@given(body=st.one_of(
    st.dictionaries(st.text(max_size=10), json_values, max_size=5),
    st.fixed_dictionaries({"event": st.dictionaries(_KEYS, json_values, max_size=8)},
                          optional={"event_id": json_values, "team_id": json_values}),
    st.fixed_dictionaries({"event": st.fixed_dictionaries(
        {"type": st.sampled_from(["message", "app_mention"]), "user": st.just("U1"), "channel": st.just("D1"),
         "channel_type": st.just("im"), "ts": st.text(max_size=70), "text": json_values},
        optional={"thread_ts": json_values, "subtype": json_values})},
        optional={"event_id": st.text(max_size=80), "team_id": st.text(max_size=20)}),
))
async def test_arbitrary_bodies_never_raise(redis_client: aioredis.Redis, body: dict[str, Any]) -> None:
    rec = _rec(redis_client)
    await _on_event(_intake(rec), rec, body)


@_fuzz(300)
# Without Slack markup (``<…>`` and ``&`` escapes are rewritten), and not a stop word.
@given(text=text_without("<>&").filter(lambda t: t.strip().lower() not in ("stop", "!stop")), how=st.sampled_from(["dm", "mention", "mention_end", "thread"]))
async def test_valid_messages_submit_once_with_text_intact(
    redis_client: aioredis.Redis, text: str, how: str
) -> None:
    rec = _rec(redis_client)
    intake = _intake(rec)
    ts = _next_ts()
    if how == "dm":
        event_ = message_event(text, channel="D1", user="U1", ts=ts, channel_type="im")
    elif how == "mention":
        event_ = message_event(f"<@UBOT> {text}", channel="C1", user="U1", ts=ts, kind="app_mention")
    elif how == "mention_end":
        event_ = message_event(f"{text} <@UBOT|botd>", channel="C1", user="U1", ts=ts, kind="app_mention")
    else:
        root = message_event("<@UBOT> start", channel="C1", user="U1", ts=ts, kind="app_mention")
        assert (await intake.on_event(event_callback(root, team_id=TEAM))).status == "submitted"
        rec.requests.clear()
        event_ = message_event(text, channel="C1", user="U1", ts=_next_ts(), thread_ts=ts)
    body = event_callback(event_, team_id=TEAM)
    outcome = await intake.on_event(body)
    assert outcome.status == "submitted", outcome
    [request] = rec.requests
    assert request.text == text.strip()
    if how == "thread":
        assert request.thread_id == ts and request.session_key.endswith(f":thread:{ts}")
    # Slack's retry (same event_id) and the message/app_mention twin (same ts) add nothing.
    twin = dict(body, event_id=f"Ev{uuid.uuid4().hex[:12]}", event=dict(body["event"], type="message"))
    for again in (body, twin):
        assert (await intake.on_event(again)).status == "duplicate"
    assert len(rec.requests) == 1


@_fuzz(150)
@given(
    text=hostile_text,
    who=st.sampled_from([("U2", "D1", "im"), ("U2", "C1", "channel"), ("U1", "C2", "channel"), ("", "D1", "im"),
                         ("UBOT", "D1", "im")]),
    extra=st.sampled_from([{}, {"bot_id": "B9"}, {"bot_profile": {"id": "B9"}}, {"subtype": "bot_message"}]),
)
async def test_strangers_bots_and_self_get_nothing(
    redis_client: aioredis.Redis, text: str, who: tuple[str, str, str], extra: dict[str, Any]
) -> None:
    rec = _rec(redis_client)
    user, channel, channel_type = who
    for kind in ("message", "app_mention"):
        event_ = message_event(f"<@UBOT> {text}", channel=channel, user=user, ts=_next_ts(), kind=kind,
                               channel_type=channel_type, **extra)
        outcome = await _intake(rec).on_event(event_callback(event_, team_id=TEAM))
        assert outcome.status in ("ignored", "denied"), outcome
    assert rec.requests == []


_DM = {"type": "message", "channel": "D1", "channel_type": "im", "user": "U1", "text": "hi"}


@pytest.mark.parametrize(
    "body",
    [
        {"team_id": "T\ud800", "event": {**_DM, "ts": "1.1"}},
        {"event_id": "Ev\udc00", "event": {**_DM, "ts": "1.2"}},
        {"event_id": "Ev1\n", "event": {**_DM, "ts": "1.3"}},
        {"event_id": "E" * 500, "event": {**_DM, "ts": "1.4"}},
        {"event": {**_DM, "user": "U1\ud800", "ts": "1.5"}},
        {"event": {**_DM, "channel": "D1\n", "ts": "1.6"}},
        {"event": {**_DM, "ts": "1.7\n"}},
        {"event": {**_DM, "ts": "1.8", "thread_ts": "1.1\n", "channel_type": None}},
    ],
    ids=["team-surrogate", "event-id-surrogate", "event-id-newline", "event-id-long", "user-surrogate",
         "channel-newline", "ts-newline", "thread-newline"],
)
async def test_odd_ids_are_ignored_not_raised(redis_client: aioredis.Redis, body: dict[str, Any]) -> None:
    rec = _rec(redis_client)
    outcome = await _intake(rec).on_event(body)
    assert outcome.status in ("ignored", "denied", "submitted"), outcome
    for request in rec.requests:  # whatever is submitted names only well-formed ids
        assert not any("\n" in (v or "") for v in (request.chat_id, request.thread_id, request.reply_to))
