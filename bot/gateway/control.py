"""Control commands (/stop, /stopall, /new, /status, /compact, /model, /usage, /help,
/approve, /deny): recognised in any channel, answered at once, never queued.

They bypass the queue, the burst window and the input guard: a /stop must never wait
behind the run it is meant to stop. ``/compact`` takes minutes at worst, so it runs in
the background holding the session lock (messages that arrive meanwhile wait in the
inbox); while a run is active it is refused, not queued.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from agent.types import RunRequest
from bot import metrics
from bot.compactor import CompactOutcome, SessionCompactor
from bot.gateway.approvals import Approvals
from bot.gateway.context import context_tokens
from bot.gateway.inbox import Inbox
from bot.gateway.reply import DeliveryLedger, notify
from bot.models import ModelCatalog, ModelProfile
from bot.store.locks import SessionLock
from bot.store.sessions import SessionStore
from bot.tracing import TraceStore
from bot.workspaces import SessionWorkspaces
from channels.base import UNLISTED, ChannelAdapter, Target

log = structlog.get_logger(__name__)

COMMANDS: tuple[tuple[str, str], ...] = (
    ("stop", "Stop the current run"),
    ("stopall", "Stop the current run and drop queued messages"),
    ("new", "Start a fresh session"),
    ("status", "Show model, tokens, queue and active run"),
    ("compact", "Summarize the conversation now (optional focus)"),
    ("model", "List the models or switch this chat's model"),
    ("usage", "Tokens, context fill, compactions and cost"),
    ("help", "List the commands"),
)

HELP_TEXT = (
    "Commands:\n"
    "/stop — stop the current run\n"
    "/stopall — stop the current run and drop queued messages\n"
    "/new — start a fresh session\n"
    "/status — model, tokens, queue and active run\n"
    "/compact [focus] — summarize the conversation now, keeping what the focus names\n"
    "/model [id] — list the models, or switch this conversation to one\n"
    "/usage — tokens of the last run and in total, context fill, compactions, cost\n"
    "/approve ID, /deny ID — answer a tool approval request\n"
    "/help — this list"
)

_COMMAND = re.compile(
    r"^/(stop|stopall|new|reset|status|help|approve|deny|compact|model|usage)(?:@[A-Za-z0-9_]+)?(?:\s+(.*?))?\s*$",
    re.I | re.S,
)
# Commands and what they take after the name: nothing, one word, or free text.
_ONE_WORD = frozenset({"approve", "deny", "model"})
_FREE_TEXT = frozenset({"compact"})
MAX_FOCUS_CHARS = 500


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
    arg = (match.group(2) or "").strip() or None
    if name in ("approve", "deny") and not arg:
        return None
    if arg is not None and name in _ONE_WORD and len(arg.split()) != 1:
        return None
    if arg is not None and name not in _ONE_WORD | _FREE_TEXT:
        return None
    if name in _FREE_TEXT and arg is not None and len(arg) > MAX_FOCUS_CHARS:
        return None  # a long text after /compact is a message, not a focus
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
    def session_lock(self, session_key: str, on_lost: Callable[[], None]) -> SessionLock: ...
    def kick(self, session_key: str) -> None: ...


class ControlCommands:
    def __init__(
        self,
        channels: dict[str, ChannelAdapter],
        sessions: SessionStore,
        approvals: Approvals,
        ledger: DeliveryLedger,
        *,
        models: ModelCatalog,
        compactor: SessionCompactor | None = None,
        traces: TraceStore | None = None,
        workspaces: SessionWorkspaces | None = None,
    ) -> None:
        self._channels = channels
        self._sessions = sessions
        self._approvals = approvals
        self._ledger = ledger
        self._models = models
        self._compactor = compactor
        self._workspaces = workspaces
        self._traces = traces
        self._compactions: set[asyncio.Task[None]] = set()

    async def aclose(self) -> None:
        """Cancel compactions still running (the session is left as it was)."""
        tasks = list(self._compactions)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)

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
        elif command.name == "compact":
            refused = await self._start_compaction(req, command.arg, gateway)
            if refused is None:
                return  # started, and already said so
            text = refused
        elif command.name == "model":
            if command.arg is not None and req.meta.get(UNLISTED):
                text = "Only the bot's listed users can switch the model; /model alone lists them."
            else:
                text = await self._model_command(session_key, command.arg)
        elif command.name == "usage":
            text = await self._usage(session_key)
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
        profile = await self._models.for_session(self._sessions, session_key)
        window = profile.context_window
        share = usage.last_prompt_tokens / window
        lines = [
            f"Model: {profile.id}",
            f"Tokens: last prompt {usage.last_prompt_tokens} ({share:.0%} of {window}), "
            f"total prompt {usage.total_prompt_tokens}, total completion {usage.total_completion_tokens}",
            f"Queue: {waiting} waiting",
            f"Active run: {'yes' if running else 'no'}",
        ]
        failure = await self._last_failure(session_key)
        if failure:
            lines.append(failure)
        return "\n".join(lines)

    # -- /compact, /model, /usage -------------------------------------------------------
    async def _start_compaction(self, req: RunRequest, focus: str | None, gateway: GatewayOps) -> str | None:
        """Take the session lock and compact in the background; refused while a run holds it.

        Returns the refusal, or None once the compaction started (the chat was told first,
        so "Compacting…" always comes before the result)."""
        if self._compactor is None:
            return "Compaction is not available here."
        session_key = req.session_key
        task: asyncio.Task[None] | None = None

        def lost() -> None:  # another holder took the lock: stop; the replace would be refused anyway
            if task is not None:
                task.cancel()

        lock = gateway.session_lock(session_key, lost)
        if not await lock.acquire(wait=False):
            if await self._compactor.in_progress(session_key):
                return "This conversation is being compacted already; the result follows."
            return "A reply is in progress. Send /compact again once it has finished, or /stop it first."
        try:
            await self._answer(req, "Compacting this conversation…")
        except BaseException:
            await asyncio.shield(lock.release())
            raise
        task = asyncio.create_task(self._compact(req, focus, lock, gateway), name=f"compact:{session_key}")
        self._compactions.add(task)
        task.add_done_callback(self._compactions.discard)
        return None

    async def _compact(self, req: RunRequest, focus: str | None, lock: SessionLock, gateway: GatewayOps) -> None:
        assert self._compactor is not None
        session_key = req.session_key
        try:
            profile = await self._models.for_session(self._sessions, session_key)
            settings = self._workspaces.settings_for(req) if self._workspaces is not None else None
            outcome = await self._compactor.compact_now(session_key, profile=profile, focus=focus, settings=settings)
            text = _compaction_text(outcome, profile)
        except Exception as exc:  # the store went away; the session is as it was
            log.warning("command.compact_failed", session_key=session_key, error=str(exc))
            text = "Compaction failed; the conversation is unchanged. Please try again later."
        finally:
            await asyncio.shield(lock.release())
            gateway.kick(session_key)  # messages that waited behind the compaction
        channel = self._channels.get(req.channel)
        if channel is not None:
            await notify(channel, Target.of(req), self._ledger, req.run_id, "compacted", text)

    async def _model_command(self, session_key: str, wanted: str | None) -> str:
        current = await self._models.for_session(self._sessions, session_key)
        if wanted is None:
            lines = ["Models (/model ID switches this conversation):"]
            for model_id in self._models.ids():
                profile = self._models.profile(model_id)
                assert profile is not None
                mark = " — current" if model_id == current.id else ""
                lines.append(f"• {model_id} ({profile.context_window:,} tokens of context){mark}")
            return "\n".join(lines)
        profile = self._models.profile(wanted)
        if profile is None:
            return f"Unknown model “{wanted[:80]}”. Available: {', '.join(self._models.ids())}."
        await self._sessions.set_model(session_key, profile.id)
        tokens = await context_tokens(self._sessions, session_key)
        text = f"This conversation now uses {profile.id} ({profile.context_window:,} tokens of context)."
        if tokens > profile.context_window * 0.95:
            text += " The conversation is larger than that; it will be compacted before the next answer."
        return text

    async def _usage(self, session_key: str) -> str:
        usage = await self._sessions.usage(session_key)
        info = await self._sessions.show(session_key)
        profile = await self._models.for_session(self._sessions, session_key)
        tokens = await context_tokens(self._sessions, session_key, usage)
        lines = [
            f"Model: {profile.id}",
            f"Last run: {usage.last_run_prompt_tokens:,} prompt + {usage.last_run_completion_tokens:,} completion tokens",
            f"Total: {usage.total_prompt_tokens:,} prompt + {usage.total_completion_tokens:,} completion tokens",
            f"Context: about {tokens:,} of {profile.context_window:,} tokens ({tokens / profile.context_window:.0%})",
            f"Compactions: {info.compactions}",
        ]
        if usage.total_cost is not None or profile.price is not None:
            lines.append(f"Cost: {_money(usage.last_run_cost)} last run, {_money(usage.total_cost)} total")
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


def _money(value: float | None) -> str:
    return f"{value or 0:.4f}"


def _compaction_text(outcome: CompactOutcome, profile: ModelProfile) -> str:
    """The reply to /compact: what changed, in messages and tokens of the model's window."""
    window = profile.context_window

    def size(messages: int, tokens: int) -> str:
        return f"{messages} message(s), about {tokens:,} tokens ({tokens / window:.0%} of {window:,})"

    if outcome.status == "compacted":
        return (
            f"Compacted: {size(outcome.before_messages, outcome.before_tokens)} → a summary and "
            f"{size(outcome.after_messages, outcome.after_tokens)}."
        )
    if outcome.status == "nothing":
        return f"Nothing to compact yet: {size(outcome.before_messages, outcome.before_tokens)}."
    if outcome.status == "in_progress":
        return "A compaction of this conversation is already running."
    if outcome.status == "changed":
        return "The conversation changed while it was being compacted; nothing was changed. Try /compact again."
    return "Compaction failed; the conversation is unchanged. Please try again later."
