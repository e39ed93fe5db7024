"""The ``/botd`` slash command and the approval buttons, as control RunRequests.

What they mean is decided here without I/O (:meth:`CommandIntake.plan_command`,
:meth:`CommandIntake.parse_approval`); the adapter then submits, and acks only once the
gateway accepted it (else Slack gets a 503 / no ack and shows the person an error).
A slash command carries no thread, so in a channel it acts on the thread the person
last talked to the bot in (remembered by intake.py), else on the channel itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from agent.types import RunRequest, SlackChat
from channels.base import ChannelContext, SubmitResult
from channels.slack.access import AccessPolicy
from channels.slack.intake import last_thread_key

log = structlog.get_logger(__name__)

APPROVE_ACTION = "botd_approve"
DENY_ACTION = "botd_deny"
USAGE = "Usage: /botd stop | stopall | new | status | help"

_SUBCOMMANDS = {
    "stop": ("/stop", "Stopping the current run…"),
    "stopall": ("/stopall", "Stopping the current run and clearing the queue…"),
    "new": ("/new", "Starting a fresh session…"),
    "reset": ("/new", "Starting a fresh session…"),
    "status": ("/status", "Checking…"),
    "help": ("/help", "Listing the commands…"),
    "": ("/help", "Listing the commands…"),
}
_APPROVAL_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True)
class CommandPlan:
    """What a slash command will do: the ephemeral ack, and the control text to submit."""

    ack_text: str
    control: str | None = None
    rejected: str = ""  # why there is nothing to submit: "denied", "unknown", "malformed"
    team: str = ""
    channel: str = ""
    user: str = ""
    user_name: str = ""
    trigger: str = ""


@dataclass(frozen=True)
class ApprovalAnswer:
    """A button press on an approval prompt by an admitted person."""

    decision: Literal["approve", "deny"]
    approval_id: str
    team: str
    channel: str
    user: str
    message_ts: str
    thread_ts: str | None
    trigger: str
    message: dict[str, Any]


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def sender_of(body: dict[str, Any]) -> str:
    """The user of a slash command or a ``block_actions`` payload ("" when absent)."""
    return _str(body.get("user_id")) or _str(_obj(body, "user").get("id"))


def _obj(body: dict[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key)
    return value if isinstance(value, dict) else {}


class CommandIntake:
    def __init__(self, ctx: ChannelContext, policy: AccessPolicy, team_id: str) -> None:
        self._ctx = ctx
        self._policy = policy
        self._team = team_id

    # -- slash command ----------------------------------------------------------------
    def plan_command(self, body: dict[str, Any], *, paired: bool = False) -> CommandPlan:
        """``paired``: the sender is approved by pairing (the adapter asked the store)."""
        channel, user = _str(body.get("channel_id")), _str(body.get("user_id"))
        if not _ID.match(channel) or not _ID.match(user):
            return CommandPlan("This command needs a channel and a user.", rejected="malformed")
        policy = self._policy.with_user(user) if paired else self._policy
        if not policy.admits(is_dm=channel.startswith("D"), channel_id=channel, user_id=user):
            log.info("slack.command_denied", channel=channel, user=user)
            return CommandPlan("You are not allowed to control this bot here.", rejected="denied")
        word = _str(body.get("text")).strip().lower()
        if word not in _SUBCOMMANDS:
            return CommandPlan(f"Unknown command “{word[:40]}”. {USAGE}", rejected="unknown")
        control, ack = _SUBCOMMANDS[word]
        return CommandPlan(
            ack_text=ack,
            control=control,
            team=_str(body.get("team_id")) or self._team,
            channel=channel,
            user=user,
            user_name=_str(body.get("user_name")),
            trigger=_str(body.get("trigger_id")),
        )

    async def run_command(self, plan: CommandPlan) -> SubmitResult | None:
        if plan.control is None:
            return None
        is_dm = plan.channel.startswith("D")
        thread: str | None = None
        if is_dm:
            session = self._ctx.session_key("dm", plan.user)
        else:
            thread = await self._ctx.kv.get(last_thread_key(plan.channel, plan.user))
            session = self._ctx.session_key("channel", plan.channel, thread=thread)
        request = RunRequest(
            session_key=session,
            channel="slack",
            chat_id=plan.channel,
            thread_id=thread,
            user_id=plan.user,
            user_name=plan.user_name,
            text=plan.control,
            dedupe_key=f"slack:{plan.team}:command:{plan.trigger}" if plan.trigger else None,
            chat=SlackChat(team=plan.team, scope="dm" if is_dm else "channel"),
        )
        result = await self._ctx.submit(request)
        log.info("slack.command_submitted", run_id=request.run_id, text=plan.control, status=result.status)
        return result

    # -- approval buttons -------------------------------------------------------------
    def parse_approval(self, body: dict[str, Any], *, paired: bool = False) -> ApprovalAnswer | None:
        """The answer in a ``block_actions`` payload, or None (not ours, malformed, stranger);
        ``paired``: the sender is approved by pairing."""
        actions = body.get("actions")
        if not isinstance(actions, list):
            return None
        action = next(
            (
                a
                for a in actions
                if isinstance(a, dict) and a.get("action_id") in (APPROVE_ACTION, DENY_ACTION)
            ),
            None,
        )
        if action is None:
            return None
        approval_id = _str(action.get("value"))
        user_obj, container, message = _obj(body, "user"), _obj(body, "container"), _obj(body, "message")
        user = _str(user_obj.get("id"))
        channel = _str(_obj(body, "channel").get("id")) or _str(container.get("channel_id"))
        message_ts = _str(container.get("message_ts")) or _str(message.get("ts"))
        thread_ts = _str(message.get("thread_ts")) or _str(container.get("thread_ts")) or None
        if not (
            _APPROVAL_ID.match(approval_id)
            and _ID.match(user)
            and _ID.match(channel)
            and _ID.match(message_ts)
        ):
            log.warning("slack.approval_malformed")
            return None
        policy = self._policy.with_user(user) if paired else self._policy
        if not policy.admits(is_dm=channel.startswith("D"), channel_id=channel, user_id=user):
            log.info("slack.approval_denied", channel=channel, user=user, approval_id=approval_id)
            return None
        return ApprovalAnswer(
            decision="approve" if action.get("action_id") == APPROVE_ACTION else "deny",
            approval_id=approval_id,
            team=_str(_obj(body, "team").get("id")) or _str(user_obj.get("team_id")) or self._team,
            channel=channel,
            user=user,
            message_ts=message_ts,
            thread_ts=thread_ts if thread_ts and _ID.match(thread_ts) else None,
            trigger=_str(body.get("trigger_id")) or _str(action.get("action_ts")),
            message=message,
        )

    async def submit_approval(self, answer: ApprovalAnswer) -> SubmitResult:
        is_dm = answer.channel.startswith("D")
        if is_dm:
            session = self._ctx.session_key("dm", answer.user)
        else:
            session = self._ctx.session_key(
                "channel", answer.channel, thread=answer.thread_ts or answer.message_ts
            )
        request = RunRequest(
            session_key=session,
            channel="slack",
            chat_id=answer.channel,
            thread_id=answer.thread_ts if is_dm else (answer.thread_ts or answer.message_ts),
            user_id=answer.user,
            text=f"/{answer.decision} {answer.approval_id}",
            reply_to=answer.message_ts,
            dedupe_key=f"slack:{answer.team}:action:{answer.trigger}" if answer.trigger else None,
            chat=SlackChat(team=answer.team, scope="dm" if is_dm else "channel"),
        )
        result = await self._ctx.submit(request)
        log.info(
            "slack.approval_submitted", run_id=request.run_id, decision=answer.decision, status=result.status
        )
        return result
