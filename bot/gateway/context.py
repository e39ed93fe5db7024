"""A session's context in the gateway: how full it is, and making room before a model call.

The agent side (``agent.budget``) decides when a request is too big; this side knows the
session: its model, its stored history and summary, and how to compact it. A run gets
a :class:`RunContext` whose ``compact`` is the loop's pre-flight hook; ``/usage``,
``/status`` read :func:`context_tokens`, and a chat reply ends with
:meth:`RunContext.warning_notice` when the run left the context nearly full.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog

from agent import notices
from agent.budget import SUMMARY_RESERVE_TOKENS, Baseline, ContextBudget
from agent.history import prepare_history
from agent.tokens import estimate_tokens
from agent.tools.registry import ToolSettings
from agent.types import Message, Usage
from bot.compactor import SessionCompactor, stored_tokens
from bot.models import ModelProfile
from bot.store.session_info import SessionUsage
from bot.store.sessions import SessionContext, SessionStore

log = structlog.get_logger(__name__)


async def context_tokens(sessions: SessionStore, session_key: str, usage: SessionUsage | None = None) -> int:
    """About how many tokens the session's next request starts with.

    The last call's prompt plus its answer when the store has them (they describe the
    stored history); after a compaction or ``/new`` the estimate of what is stored.
    """
    usage = usage or await sessions.usage(session_key)
    if usage.last_prompt_tokens > 0:
        return usage.last_prompt_tokens + usage.last_completion_tokens
    snapshot = await sessions.snapshot(session_key)
    return stored_tokens(snapshot.messages, snapshot.summary)


def baseline_for(usage: SessionUsage, request: Sequence[Message], new: int) -> Baseline | None:
    """The first call's baseline: the last stored call covers everything but the ``new`` messages."""
    if usage.last_prompt_tokens <= 0:
        return None
    return Baseline(usage.last_prompt_tokens + usage.last_completion_tokens, len(request) - new)


@dataclass
class RunContext:
    """One run's session context: its model, and the pre-flight compaction hook."""

    sessions: SessionStore
    compactor: SessionCompactor | None
    session_key: str
    profile: ModelProfile
    history_turns: int
    system: Message | None = None
    user_messages: Sequence[Message] = ()
    settings: ToolSettings | None = None  # the session's directory, where the flush keeps memories
    # What the run read first (:meth:`SessionStore.context`): the first request is built
    # from it; a request after a compaction reads the store again.
    loaded: SessionContext | None = None
    usage: SessionUsage | None = field(default=None, init=False)  # as stored when the run started
    warned: bool | None = field(default=None, init=False)  # the chat had the context warning then
    rearm_warning: bool = field(default=False, init=False)  # the run's finish clears the warning

    def __post_init__(self) -> None:
        if self.loaded is not None:
            self.usage, self.warned = self.loaded.usage, self.loaded.context_warned

    @property
    def budget(self) -> ContextBudget:
        return ContextBudget(self.profile.context_window)

    async def request(self, user_messages: Sequence[Message], system: Message) -> list[Message]:
        """The run's first request: system prompt, the prepared stored history, the new messages."""
        self.system, self.user_messages = system, list(user_messages)
        state, self.loaded = self.loaded or await self.sessions.context(self.session_key), None
        prepared = prepare_history(
            state.messages,
            history_turns=self.history_turns,
            context_window_tokens=self.profile.context_window,
            summary=state.summary,
        )
        return [system, *prepared, *self.user_messages]

    async def compact(self, allowance: int) -> list[Message] | None:
        """The loop's hook: compact the stored session so the run's starting messages fit
        in ``allowance`` tokens; their replacement, or None when nothing was stored."""
        if self.compactor is None or self.system is None:
            return None
        fixed = estimate_tokens([self.system, *self.user_messages], include_tool_calls=True)
        keep_tokens = allowance - fixed - SUMMARY_RESERVE_TOKENS
        outcome = await self.compactor.compact_now(
            self.session_key, profile=self.profile, keep_tokens=keep_tokens, settings=self.settings
        )
        log.info(
            "context.preflight_compaction", session_key=self.session_key, status=outcome.status,
            before_tokens=outcome.before_tokens, after_tokens=outcome.after_tokens,
        )
        if not outcome.stored:
            return None
        return await self.request(self.user_messages, self.system)

    async def warning_notice(self, last_call: Usage) -> str:
        """The line added under a chat reply when the context passed the warning share
        (once, until it drops below again); empty otherwise, or when the store fails.
        Below the line, a chat that was warned is re-armed by the run's finishing write."""
        tokens = last_call.prompt_tokens + last_call.completion_tokens
        over = self.budget.should_warn(tokens)
        if not over and self.warned is not None:
            self.rearm_warning = self.warned
            return ""
        try:
            first = await self.sessions.note_context_warning(self.session_key, over)
        except Exception as exc:
            log.warning("context.warning_failed", session_key=self.session_key, error=str(exc))
            return ""
        return f"\n\n{notices.context_warning(self.budget.fill(tokens))}" if first else ""
