"""Slack events to RunRequests: filter, admit, key the session, submit (the gateway dedupes).

Socket Mode and HTTP Events both end here (through the bolt listeners in adapter.py),
so there is one normalization path. What it decides:

- only ``message`` and ``app_mention`` events by people count: edits, deletions, joins,
  bot messages and the bot's own messages are ignored;
- a DM (``channel_type`` im) always addresses the bot; in a channel the bot is
  addressed by its mention, by a reply in a thread it is in (a thread whose session a
  mention started, remembered 7 days), or by any message when ``require_mention`` is off;
- access (access.py) is checked before anything is stored or submitted; with
  ``dm_policy: pairing`` a user approved by pairing counts as allowed, and a stranger's
  DM is answered with a pairing code (once per post) instead of being submitted;
- Slack's retries (same ``event_id``) and the message/app_mention twins of one post
  (same team, channel, ts) carry one dedupe key, so the gateway runs the post once;
- ``stop`` / ``!stop`` as the whole message becomes ``/stop``;
- the message's ``files`` become attachments (a message may be files alone).

An event is *accepted* once the gateway has taken it (``submit`` answered anything but
``error``); only then may the adapter acknowledge it to Slack. An :class:`Outcome` of
``failed`` means it was not accepted: the adapter answers 503 (HTTP) or leaves the
envelope unacked (Socket Mode), and Slack delivers it again. Dedupe is the gateway's:
every event of one post (Slack's retries, the message/app_mention twins) carries the
dedupe key ``slack:<team>:<channel>:<ts>``, and the gateway takes it atomically with
the enqueue, so a post runs once and a retry of a post not yet accepted is taken.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from agent.types import RunRequest, SlackChat
from channels.base import ChannelContext, PairingGate, SubmitResult
from channels.slack.access import AccessPolicy
from channels.slack.files import message_files
from channels.slack.text import strip_mention, to_plain

log = structlog.get_logger(__name__)

DAY_S = 24 * 3600
THREAD_TTL_S = 7 * DAY_S

# Subtypes that are still a person's new message; every other subtype is ignored.
_PERSON_SUBTYPES = frozenset({"", "thread_broadcast", "file_share", "me_message"})
_STOP_WORDS = frozenset({"stop", "!stop"})
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def message_key(team: str, channel: str, ts: str) -> str:
    return f"slack:{team}:{channel}:{ts}"


def thread_key(channel: str, thread_ts: str) -> str:
    return f"slack:thread:{channel}:{thread_ts}"


def last_thread_key(channel: str, user: str) -> str:
    return f"slack:last_thread:{channel}:{user}"


@dataclass(frozen=True)
class BotIdentity:
    """Who the bot is in this workspace (from ``auth.test``)."""

    team_id: str
    user_id: str
    bot_id: str


@dataclass(frozen=True)
class Outcome:
    """What became of one inbound event (logged, and handy in tests).

    ``failed`` means not accepted: Slack must deliver it again. Every other status is
    final and may be acknowledged.
    """

    status: Literal["submitted", "duplicate", "ignored", "denied", "failed"]
    reason: str = ""

    @property
    def accepted(self) -> bool:
        return self.status != "failed"

    @classmethod
    def of(cls, result: SubmitResult) -> Outcome:
        """The gateway's answer to a submit: only ``error`` is not accepted."""
        if result.status == "error":
            return cls("failed", result.detail or "not accepted")
        if result.status == "duplicate":
            return cls("duplicate")
        return cls("submitted", result.status)


def is_dm_channel(channel: str, channel_type: str | None = None) -> bool:
    return channel_type == "im" or (channel_type is None and channel.startswith("D"))


class SlackIntake:
    """Normalizes message events and submits them through the daemon's context."""

    def __init__(
        self,
        ctx: ChannelContext,
        identity: BotIdentity,
        policy: AccessPolicy,
        *,
        require_mention: bool,
        pairing: PairingGate | None = None,
    ) -> None:
        self._ctx = ctx
        self._me = identity
        self._policy = policy
        self._require_mention = require_mention
        self._pairing = pairing

    async def on_event(self, body: dict[str, Any]) -> Outcome:
        event = body.get("event")
        if not isinstance(event, dict):
            return Outcome("ignored", "no_event")
        kind = event.get("type")
        if kind not in ("message", "app_mention"):
            return Outcome("ignored", f"event:{kind}")
        subtype = str(event.get("subtype") or "")
        if subtype not in _PERSON_SUBTYPES:
            return Outcome("ignored", f"subtype:{subtype}")
        user = str(event.get("user") or "")
        if event.get("bot_id") or event.get("bot_profile") or not user:
            return Outcome("ignored", "bot")
        if user == self._me.user_id:
            return Outcome("ignored", "self")
        channel, ts = str(event.get("channel") or ""), str(event.get("ts") or "")
        if not _SAFE_ID.fullmatch(channel) or not _SAFE_ID.fullmatch(ts):
            return Outcome("ignored", "malformed")
        team = str(body.get("team_id") or event.get("team") or self._me.team_id)
        event_id = str(body.get("event_id") or "")
        if not _SAFE_ID.fullmatch(team) or (event_id and not _SAFE_ID.fullmatch(event_id)):
            return Outcome("ignored", "malformed")
        raw_thread = event.get("thread_ts")
        thread_ts = str(raw_thread) if raw_thread and _SAFE_ID.fullmatch(str(raw_thread)) else None
        is_dm = is_dm_channel(channel, event.get("channel_type"))
        text, mentioned = strip_mention(str(event.get("text") or ""), self._me.user_id)
        mentioned = mentioned or kind == "app_mention"
        in_thread = thread_ts is not None and thread_ts != ts

        if not is_dm and not mentioned and self._require_mention and not in_thread:
            return Outcome("ignored", "not_addressed")
        policy = self._policy
        if (
            self._pairing is not None
            and not policy.admits(is_dm=is_dm, channel_id=channel, user_id=user)
            and await self._pairing.is_approved(user)
        ):
            policy = policy.with_user(user)
        if not policy.admits(is_dm=is_dm, channel_id=channel, user_id=user):
            log.info("slack.denied", channel=channel, user=user)
            if is_dm and self._pairing is not None:
                return await self._challenge(team, channel, ts, user)
            return Outcome("denied")
        if not is_dm and not mentioned and self._require_mention:
            assert thread_ts is not None
            if await self._ctx.kv.get(thread_key(channel, thread_ts)) is None:
                return Outcome("ignored", "thread_not_joined")
        text = to_plain(text).strip()
        files = message_files(event.get("files"))
        if not text and not files:
            return Outcome("ignored", "empty")

        control = text.lower() in _STOP_WORDS and not files
        try:
            request = await self._request(
                team=team, channel=channel, user=user, ts=ts, thread_ts=thread_ts, is_dm=is_dm,
                text="/stop" if control else text, control=control,
            )  # fmt: skip
            request.attachments = files
            result = await self._ctx.submit(request)
        except Exception as exc:
            log.error("slack.submit_failed", event_id=event_id, error=str(exc))
            return Outcome("failed", type(exc).__name__)
        outcome = Outcome.of(result)
        if not outcome.accepted:
            log.error("slack.not_accepted", event_id=event_id, run_id=request.run_id, detail=result.detail)
        else:
            log.debug("slack.submitted", run_id=request.run_id, session_key=request.session_key, status=result.status)
        return outcome

    async def _challenge(self, team: str, channel: str, ts: str, user: str) -> Outcome:
        """A stranger's DM under ``dm_policy: pairing``: a code, once per post (Slack retries)."""
        assert self._pairing is not None
        if not await self._pairing.challenge(user, user, channel, dedupe_key=message_key(team, channel, ts)):
            return Outcome("duplicate")
        return Outcome("denied", "pairing")

    async def _request(
        self,
        *,
        team: str,
        channel: str,
        user: str,
        ts: str,
        thread_ts: str | None,
        is_dm: bool,
        text: str,
        control: bool,
    ) -> RunRequest:
        if is_dm:
            session = self._ctx.session_key("dm", user)
            reply_thread = thread_ts
        else:
            thread = thread_ts or ts
            if control and thread_ts is None:
                # A top-level "@bot stop" means the run this person started last here.
                thread = await self._ctx.kv.get(last_thread_key(channel, user)) or ts
            else:  # the thread is joined, and it is this person's latest here: one round trip
                await self._ctx.kv.set_many(
                    [(thread_key(channel, thread), "1", THREAD_TTL_S), (last_thread_key(channel, user), thread, DAY_S)]
                )
            session = self._ctx.session_key("channel", channel, thread=thread)
            reply_thread = thread
        return RunRequest(
            session_key=session,
            channel="slack",
            chat_id=channel,
            thread_id=reply_thread,
            user_id=user,
            text=text,
            reply_to=ts,
            dedupe_key=message_key(team, channel, ts),
            chat=SlackChat(team=team, scope="dm" if is_dm else "channel"),
        )
