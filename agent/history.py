"""The history pipeline run before every LLM call: summary, turn limit, pruning, repair.

The stored session is never changed by it; it builds the list of messages the
model gets. The order matters: cutting turns and pruning can leave tool calls
and results unpaired, so repair comes last.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from agent.history_repair import MISSING_RESULT, repair_pairing
from agent.pruning import CLEARED_RESULT, prune_tool_results
from agent.tokens import context_usage, estimate_tokens
from agent.types import Message

__all__ = [
    "CLEARED_RESULT",
    "MISSING_RESULT",
    "SUMMARY_ACK",
    "SUMMARY_HEADER",
    "context_usage",
    "estimate_tokens",
    "keep_last_turns",
    "prepare_history",
    "prune_tool_results",
    "repair_pairing",
    "summary_messages",
]

SUMMARY_HEADER: Final[str] = "[Summary of the earlier conversation]"
SUMMARY_ACK: Final[str] = (
    "Understood. I have the summary of our earlier conversation and will continue from it."
)


def _leading_system_count(messages: Sequence[Message]) -> int:
    count = 0
    for message in messages:
        if message.role != "system":
            break
        count += 1
    return count


def keep_last_turns(messages: Sequence[Message], turns: int) -> list[Message]:
    """The leading system messages plus the last ``turns`` user turns.

    A turn is a user message with everything after it up to the next user message
    (assistant replies, tool calls and their results), so cutting never splits a turn.
    """
    if turns < 1:
        raise ValueError(f"turns must be at least 1, got {turns}")
    head = _leading_system_count(messages)
    users = [i for i in range(head, len(messages)) if messages[i].role == "user"]
    if len(users) <= turns:
        return list(messages)
    return list(messages[:head]) + list(messages[users[-turns] :])


def summary_messages(summary: str) -> list[Message]:
    """The user/assistant pair that carries a compaction summary into the next request."""
    return [Message.user(f"{SUMMARY_HEADER}\n{summary}"), Message.assistant(SUMMARY_ACK)]


def prepare_history(
    messages: Sequence[Message],
    *,
    history_turns: int,
    context_window_tokens: int,
    summary: str | None = None,
) -> list[Message]:
    """Build the model's view of a session: summary pair, last turns, pruned, repaired.

    The summary pair goes right after the leading system messages. It is added after the
    turn limit is applied, so it is never the turn that gets cut away and does not count
    as one of ``history_turns``; as the first user message it is also never pruned.
    """
    kept = keep_last_turns(messages, history_turns)
    if summary is not None and summary.strip():
        head = _leading_system_count(kept)
        kept = kept[:head] + summary_messages(summary.strip()) + kept[head:]
    pruned = prune_tool_results(kept, context_window_tokens)
    return repair_pairing(pruned)
