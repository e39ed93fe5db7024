"""Control commands (/stop, /stopall, /new, /status, /help, /approve, /deny): recognised
in any channel, answered at once, never queued.

They bypass the queue, the burst window and the input guard: a /stop must never wait
behind the run it is meant to stop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aioredis
import structlog

from agent.types import RunRequest
from bot import metrics
from bot.gateway.approvals import Approvals
from bot.gateway.inbox import Deduper, Inbox
from bot.gateway.reply import DeliveryLedger, notify
from bot.store.keys import Keys
from bot.store.sessions import SessionStore
from bot.tracing import TraceStore
from channels.base import ChannelAdapter, Target

log = structlog.get_logger(__name__)

COMMANDS: tuple[tuple[str, str], ...] = (
    ("stop", "Stop the current run"),
    ("stopall", "Stop the current run and drop queued messages"),
    ("new", "Start a fresh session"),
    ("status", "Show model, tokens, queue and active run"),
    ("help", "List the commands"),
)

HELP_TEXT = (
    "Commands:\n"
    "/stop — stop the current run\n"
    "/stopall — stop the current run and drop queued messages\n"
    "/new — start a fresh session\n"
    "/status — model, tokens, queue and active run\n"
    "/approve ID, /deny ID — answer a tool approval request\n"
    "/help — this list"
)

_COMMAND = re.compile(r"^/(stop|stopall|new|reset|status|help|approve|deny)(?:@[A-Za-z0-9_]+)?(?:\s+(\S+))?\s*$", re.I)


@dataclass(frozen=True)
class Command:
    name: str
    arg: str | None = None


def parse_command(text: str) -> Command | None:
    """The control command in ``text``, or None when it is an ordinary message."""
    match = _COMMAND.match(text.strip())
    if match is None:
        return None
    name = match.group(1).lower()
    if name == "reset":
        name = "new"
    arg = match.group(2)
    if name in ("approve", "deny") and not arg:
        return None
    if name not in ("approve", "deny") and arg:
        return None
    return Command(name, arg)


# How long /new waits for a stopped run to end (its tools get 10 s to die) before resetting.
NEW_SESSION_WAIT_S = 12.0
# /status looks this far back through the recent traces for the session's last run.
_STATUS_TRACES = 50
_STATUS_DETAIL_CHARS = 300


class GatewayOps(Protocol):
    inbox: Inbox

    async def stop_session(self, session_key: str) -> None: ...
    async def is_busy(self, session_key: str) -> bool: ...
    async def is_running(self, session_key: str) -> bool: ...
    async def wait_not_running(self, session_key: str, timeout_s: float) -> bool: ...


class ControlCommands:
    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        channels: dict[str, ChannelAdapter],
        sessions: SessionStore,
        approvals: Approvals,
        ledger: DeliveryLedger,
        *,
        model: str,
        context_window: int,
        traces: TraceStore | None = None,
    ) -> None:
        self._deduper = Deduper(client, Keys(prefix))
        self._channels = channels
        self._sessions = sessions
        self._approvals = approvals
        self._ledger = ledger
        self._model = model
        self._context_window = context_window
        self._traces = traces

    async def first_time(self, dedupe_key: str) -> bool:
        return await self._deduper.first_time(dedupe_key)

    async def forget(self, dedupe_key: str) -> None:
        await self._deduper.forget(dedupe_key)

    async def handle(self, command: Command, req: RunRequest, gateway: GatewayOps) -> None:
        metrics.COMMANDS.labels(command.name).inc()
        log.info("command", command=command.name, session_key=req.session_key, user_id=req.user_id)
        session_key = req.session_key
        if command.name == "stop":
            await gateway.stop_session(session_key)
            text = "Stopped."
        elif command.name == "stopall":
            dropped = await gateway.inbox.clear(session_key)
            await gateway.stop_session(session_key)
            text = "Stopped." + (f" Dropped {len(dropped)} queued message(s)." if dropped else "")
        elif command.name == "new":
            # Queued messages go first, so the stopped worker has nothing left to take; the
            # reset waits for the stopped run, which would otherwise record its part of the
            # old conversation into the fresh session.
            await gateway.inbox.clear(session_key)
            await gateway.stop_session(session_key)
            if not await gateway.wait_not_running(session_key, NEW_SESSION_WAIT_S):
                log.warning("command.new_run_still_active", session_key=session_key)
            await self._sessions.reset(session_key)
            text = "Started a fresh session."
        elif command.name == "status":
            text = await self._status(session_key, gateway)
        elif command.name == "help":
            text = HELP_TEXT
        elif command.name in ("approve", "deny"):
            text = await self._approvals.resolve(
                command.arg or "", command.name == "approve", chat_id=req.chat_id, user_id=req.user_id
            )
        else:  # pragma: no cover - parse_command only yields the names above
            text = f"Unknown command /{command.name}."
        await self._answer(req, text)

    async def _status(self, session_key: str, gateway: GatewayOps) -> str:
        usage = await self._sessions.usage(session_key)
        waiting = await gateway.inbox.waiting(session_key)
        running = await gateway.is_running(session_key)
        share = usage.last_prompt_tokens / self._context_window if self._context_window else 0.0
        lines = [
            f"Model: {self._model}",
            f"Tokens: last prompt {usage.last_prompt_tokens} ({share:.0%} of {self._context_window}), "
            f"total prompt {usage.total_prompt_tokens}, total completion {usage.total_completion_tokens}",
            f"Queue: {waiting} waiting",
            f"Active run: {'yes' if running else 'no'}",
        ]
        failure = await self._last_failure(session_key)
        if failure:
            lines.append(failure)
        return "\n".join(lines)

    async def _last_failure(self, session_key: str) -> str:
        """The operator's detail of this session's last run, when it failed (only allowed
        users reach /status); the chat only got the short notice."""
        if self._traces is None:
            return ""
        for run_id in await self._traces.recent(_STATUS_TRACES):
            trace = await self._traces.load(run_id)
            if trace is None or trace.session_key != session_key:
                continue
            if trace.status in ("failed", "timeout") and trace.error:
                return f"Last run {trace.status}: {trace.error[:_STATUS_DETAIL_CHARS]}"
            return ""
        return ""

    async def _answer(self, req: RunRequest, text: str) -> None:
        channel = self._channels.get(req.channel)
        if channel is None:
            log.warning("command.no_channel", channel=req.channel)
            return
        await notify(channel, Target.of(req), self._ledger, req.run_id, "command", text)
