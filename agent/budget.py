"""The context budget: will the next request fit the model's window, and what to do if not.

Before each model call the request is estimated: the last call's reported prompt tokens
plus 4 characters per token for what was added since — and never less than the
4-characters-per-token estimate of the whole request, because a stored history can
grow without a usage figure (a failed run, a retried one). Above 95 % of the window the
run makes room first: old tool results are pruned (cheap, no model call), then the
caller's hook compacts the conversation (memory flush, then summary) aiming at 82 %.
When even that does not fit, the run ends with :class:`ContextFull` instead of sending
a request the provider would refuse. At 80 % after a run the chat is warned (the
caller's job; :meth:`ContextBudget.should_warn` says when).

The budget knows nothing of sessions or stores: the hook is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import structlog

from agent.llm_stream import encode_json
from agent.pruning import prune_tool_results
from agent.tokens import CHARS_PER_TOKEN, estimate_tokens, message_tokens
from agent.types import Message

log = structlog.get_logger(__name__)

COMPACT_AT: Final[float] = 0.95  # a request estimated above this share of the window compacts first
COMPACT_TARGET: Final[float] = 0.82  # ... aiming at this share
WARN_AT: Final[float] = 0.80  # after a run at or above this share, the chat is told once
SUMMARY_RESERVE_TOKENS: Final[int] = 2048  # room left for the summary a compaction writes

# Make the messages the run started from fit in the given number of tokens (by compacting
# the conversation); returns their replacement, or None when nothing could be done.
CompactHook = Callable[[int], Awaitable[list[Message] | None]]


class ContextFull(Exception):
    """The next request does not fit the window even after pruning and compaction."""

    def __init__(self, tokens: int, window: int) -> None:
        super().__init__(f"the request needs about {tokens} tokens; the context window is {window}")
        self.tokens = tokens
        self.window = window


@dataclass(frozen=True, slots=True)
class Baseline:
    """A measured request: its first ``covers`` messages cost ``tokens`` prompt tokens."""

    tokens: int
    covers: int


@dataclass(frozen=True, slots=True)
class ContextBudget:
    """The thresholds of one model's context window, in tokens."""

    window: int

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"the context window must be positive, got {self.window}")

    @property
    def limit(self) -> int:
        """The largest request sent without compacting first."""
        return math.floor(self.window * COMPACT_AT)

    @property
    def target(self) -> int:
        """What a pre-flight compaction aims at."""
        return math.floor(self.window * COMPACT_TARGET)

    @property
    def warn_at(self) -> int:
        return math.ceil(self.window * WARN_AT)

    def fits(self, tokens: int) -> bool:
        return tokens <= self.limit

    def should_warn(self, tokens: int) -> bool:
        return tokens >= self.warn_at

    def fill(self, tokens: int) -> float:
        """The share of the window ``tokens`` fill (above 1.0 when they overflow it)."""
        return max(tokens, 0) / self.window


def tools_tokens(tools: list[dict[str, Any]] | None) -> int:
    """Estimated tokens of the tool schemas sent with a request: the characters of their
    JSON as the request carries it (encoded as the request body is, at a tenth of the
    stdlib's cost for a dozen schemas)."""
    if not tools:
        return 0
    return -(-len(encode_json(tools).decode()) // CHARS_PER_TOKEN)


def estimate_request(
    messages: Sequence[Message], *, baseline: Baseline | None = None, tools: list[dict[str, Any]] | None = None
) -> int:
    """Estimated prompt tokens of a request (see the module docstring)."""
    whole = estimate_tokens(messages, include_tool_calls=True) + tools_tokens(tools)
    if baseline is None or baseline.tokens <= 0 or baseline.covers > len(messages):
        return whole
    added = estimate_tokens(messages[baseline.covers :], include_tool_calls=True) if baseline.covers < len(messages) else 0
    return max(whole, baseline.tokens + added)


def keep_for_target(messages: Sequence[Message], allowance: int, *, max_keep: int | None = None) -> int:
    """How many trailing ``messages`` a compaction can keep within ``allowance`` tokens.

    The kept tail never starts with tool results (their call would be summarized away),
    so the cut moves forward past them: keeping fewer, never more than fits.
    """
    limit = len(messages) if max_keep is None else max(0, min(max_keep, len(messages)))
    total = 0.0
    keep = 0
    for message in reversed(messages[len(messages) - limit :] if limit else []):
        cost = message_tokens(message, include_tool_calls=True)
        if total + cost > allowance:
            break
        total += cost
        keep += 1
    start = len(messages) - keep
    while start < len(messages) and messages[start].role == "tool":
        start += 1
    return len(messages) - start


@dataclass
class Preflight:
    """The check before each model call of one run: estimate, make room, or give up."""

    budget: ContextBudget
    compact: CompactHook | None = None
    baseline: Baseline | None = None
    compactions: int = 0  # pre-flight compactions this run stored

    def measured(self, prompt_tokens: int, sent: int, *, estimated: bool) -> None:
        """A call of ``sent`` messages reported ``prompt_tokens``: the next estimate starts there."""
        self.baseline = None if estimated or prompt_tokens <= 0 else Baseline(prompt_tokens, sent)

    async def fit(
        self, history: list[Message], own: int, tools: list[dict[str, Any]] | None, *, log_: Any = log
    ) -> list[Message]:
        """``history`` made to fit the budget; its last ``own`` messages are the run's own.

        Returns ``history`` itself when it fits; raises :class:`ContextFull` when nothing helps.
        """
        tokens = estimate_request(history, baseline=self.baseline, tools=tools)
        if self.budget.fits(tokens):
            return history
        log_.info("context.over_budget", tokens=tokens, limit=self.budget.limit, window=self.budget.window)
        pruned = prune_tool_results(history, self.budget.window)
        if pruned != history:
            history, self.baseline = pruned, None
            tokens = estimate_request(history, tools=tools)
            if self.budget.fits(tokens):
                log_.info("context.pruned", tokens=tokens)
                return history
        if self.compact is not None:
            cut = len(history) - own
            allowance = self.budget.target - estimate_tokens(history[cut:], include_tool_calls=True) - tools_tokens(tools)
            try:
                replaced = await self.compact(allowance)
            except Exception:
                log_.exception("context.compaction_crashed")
                replaced = None
            if replaced is not None:
                history, self.baseline = [*replaced, *history[cut:]], None
                self.compactions += 1
                tokens = estimate_request(history, tools=tools)
                log_.info("context.compacted", tokens=tokens, fits=self.budget.fits(tokens))
                if self.budget.fits(tokens):
                    return history
        log_.warning("context.full", tokens=tokens, window=self.budget.window)
        raise ContextFull(tokens, self.budget.window)
