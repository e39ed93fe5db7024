"""``slack.dm_policy: pairing`` through the Slack intake, with the real pairing store on Redis:
a stranger's DM is answered with a code (once per post) and never submitted; once the code
is approved the user counts as allowed for DMs, mentions, slash commands and approvals."""

from __future__ import annotations

import re

import pytest
import redis.asyncio as aioredis

from bot.pairing import ChannelPairing, PairingStore
from bot.store.keys import Keys
from channels.slack.access import AccessPolicy
from channels.slack.commands import CommandIntake, sender_of
from channels.slack.intake import BotIdentity, SlackIntake
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.slack_context import RecordingContext, RedisKeyValue
from tests.fakes.slack_server import block_action, event_callback, message_event, slash_command

TEAM = "T0FAKE"
ME = BotIdentity(team_id=TEAM, user_id="UBOT", bot_id="BBOT")
STRANGER = "U777"


@pytest.fixture
def rec(redis_client: aioredis.Redis, redis_prefix: str) -> RecordingContext:
    return RecordingContext(RedisKeyValue(redis_client, redis_prefix))


@pytest.fixture
def store(redis_client: aioredis.Redis, redis_prefix: str) -> PairingStore:
    return PairingStore(redis_client, Keys(redis_prefix))


@pytest.fixture
def slack() -> RecordingChannel:
    return RecordingChannel(name="slack")


@pytest.fixture
def gate(store: PairingStore, slack: RecordingChannel) -> ChannelPairing:
    return ChannelPairing(store, "slack", {"slack": slack})


def intake(rec: RecordingContext, gate: ChannelPairing | None) -> SlackIntake:
    return SlackIntake(rec.ctx, ME, AccessPolicy.of(("U1",), ("C1",)), require_mention=True, pairing=gate)


def dm(text: str, ts: str, user: str = STRANGER) -> dict[str, object]:
    return event_callback(message_event(text, channel="D777", user=user, ts=ts, channel_type="im"),
                          team_id=TEAM, event_id=f"Ev{ts.replace('.', '')}")


def code_in(text: str) -> str:
    found = re.search(r"code: ([A-Z0-9]{8})", text)
    assert found, text
    return found.group(1)


async def test_a_strangers_dm_gets_a_code_in_the_dm_and_is_not_submitted(
    rec: RecordingContext, gate: ChannelPairing, slack: RecordingChannel
) -> None:
    outcome = await intake(rec, gate).on_event(dm("hello", "10.1"))
    assert (outcome.status, outcome.reason) == ("denied", "pairing")
    assert rec.requests == []
    [sent] = slack.sent
    assert sent.chat_id == "D777" and code_in(sent.text)


async def test_slack_retrying_the_same_post_gets_one_reply(
    rec: RecordingContext, gate: ChannelPairing, slack: RecordingChannel
) -> None:
    first = await intake(rec, gate).on_event(dm("hello", "11.1"))
    again = await intake(rec, gate).on_event(dm("hello", "11.1"))
    assert (first.status, again.status) == ("denied", "duplicate")
    assert len(slack.sent) == 1


async def test_without_pairing_a_stranger_is_only_denied(rec: RecordingContext, slack: RecordingChannel) -> None:
    outcome = await intake(rec, None).on_event(dm("hello", "12.1"))
    assert (outcome.status, outcome.reason) == ("denied", "")
    assert slack.sent == [] and rec.requests == []


async def test_an_approved_user_is_allowed_wherever_allow_from_counts(
    rec: RecordingContext, gate: ChannelPairing, store: PairingStore, slack: RecordingChannel
) -> None:
    await intake(rec, gate).on_event(dm("hello", "13.1"))
    assert await store.approve(code_in(slack.sent[0].text)) is not None

    assert (await intake(rec, gate).on_event(dm("now?", "13.2"))).status == "submitted"
    mention = message_event("<@UBOT> hi", channel="C1", user=STRANGER, ts="13.3", kind="app_mention")
    assert (await intake(rec, gate).on_event(event_callback(mention, team_id=TEAM))).status == "submitted"
    elsewhere = message_event("<@UBOT> hi", channel="C9", user=STRANGER, ts="13.4", kind="app_mention")
    assert (await intake(rec, gate).on_event(event_callback(elsewhere, team_id=TEAM))).status == "denied"
    assert [r.text for r in rec.requests] == ["now?", "hi"]

    commands = CommandIntake(rec.ctx, AccessPolicy.of(("U1",), ("C1",)), TEAM)
    command = slash_command("stop", channel="C1", user=STRANGER, team_id=TEAM)
    assert sender_of(command) == STRANGER
    assert commands.plan_command(command).rejected == "denied"
    assert commands.plan_command(command, paired=await gate.is_approved(STRANGER)).control == "/stop"
    button = block_action("botd_approve", "appr1", user=STRANGER, channel="C1", team_id=TEAM, message_ts="5.5")
    assert sender_of(button) == STRANGER
    assert commands.parse_approval(button) is None
    assert commands.parse_approval(button, paired=True) is not None


def test_open_dms_admit_anyone_in_a_dm_but_not_in_channels() -> None:
    policy = AccessPolicy.of((), ("C1",), dm_open=True)
    assert policy.admits(is_dm=True, channel_id="D1", user_id="U5")
    assert not policy.admits(is_dm=True, channel_id="D1", user_id="")
    assert not policy.admits(is_dm=False, channel_id="C1", user_id="U5")
