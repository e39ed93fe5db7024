"""Shrink old tool results when the history grows towards the context window.

Tool output (file contents, command logs) is the bulk of most long sessions and
loses value fastest, so it is what gets cut first: above 30% of the window, long
old results keep only their head and tail; above 50%, old results are cleared
oldest first until the estimate is back under half the window. The recent part
of the conversation is never touched (the "Pruning" rules of the shared cases
README). Only the copy sent to the model is pruned; the stored session keeps
everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from agent.tokens import estimate_tokens_exact, message_tokens
from agent.types import Message

SOFT_TRIM_RATIO: Final[float] = 0.30
HARD_CLEAR_RATIO: Final[float] = 0.50
SOFT_TRIM_MIN_CHARS: Final[int] = 4000
SOFT_TRIM_HEAD: Final[int] = 1500
SOFT_TRIM_TAIL: Final[int] = 1500
PROTECTED_ASSISTANT_TURNS: Final[int] = 3
CLEARED_RESULT: Final[str] = "[Old tool result content cleared]"


def trim_marker(removed: int) -> str:
    """The text put between the head and the tail of a soft-trimmed result (under 200 chars)."""
    return f"\n\n[... {removed} characters of old tool output trimmed ...]\n\n"


def soft_trim(content: str) -> str:
    """Keep the first and last 1500 characters of ``content`` with a marker between them."""
    removed = len(content) - SOFT_TRIM_HEAD - SOFT_TRIM_TAIL
    if removed <= 0:
        return content
    return content[:SOFT_TRIM_HEAD] + trim_marker(removed) + content[-SOFT_TRIM_TAIL:]


def prunable_indices(messages: Sequence[Message]) -> list[int]:
    """Indices of the tool results pruning may change, oldest first.

    Those are the non-empty tool results after the first user message and before the
    third-from-last assistant message; with fewer than three assistant messages, none.
    """
    assistants = [i for i, m in enumerate(messages) if m.role == "assistant"]
    if len(assistants) < PROTECTED_ASSISTANT_TURNS:
        return []
    stop = assistants[-PROTECTED_ASSISTANT_TURNS]
    first_user = next((i for i, m in enumerate(messages) if m.role == "user"), -1)
    return [i for i in range(first_user + 1, stop) if messages[i].role == "tool" and messages[i].content]


def prune_tool_results(messages: Sequence[Message], context_window_tokens: int) -> list[Message]:
    """Soft-trim, then clear, old tool results so the estimate fits the window (see module doc).

    Returns a new list; the input messages are not modified.
    """
    if context_window_tokens <= 0:
        raise ValueError(f"context_window_tokens must be positive, got {context_window_tokens}")
    pruned = list(messages)
    estimate = estimate_tokens_exact(pruned)
    if estimate <= SOFT_TRIM_RATIO * context_window_tokens:
        return pruned
    candidates = prunable_indices(pruned)
    for i in candidates:
        content = pruned[i].content or ""
        if len(content) > SOFT_TRIM_MIN_CHARS:
            before = message_tokens(pruned[i])
            pruned[i] = pruned[i].model_copy(update={"content": soft_trim(content)})
            estimate += message_tokens(pruned[i]) - before
    limit = HARD_CLEAR_RATIO * context_window_tokens
    for i in candidates:
        if estimate <= limit:
            break
        before = message_tokens(pruned[i])
        pruned[i] = pruned[i].model_copy(update={"content": CLEARED_RESULT})
        estimate += message_tokens(pruned[i]) - before
    return pruned
