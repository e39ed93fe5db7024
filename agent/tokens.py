"""The canonical token estimate: 4 characters per token plus 16 tokens per message.

It is used wherever no tokenizer answer is available: pruning thresholds, the
compaction trigger, and usage figures when the API reports none. It is crude on
purpose (no model-specific tokenizer to ship or keep in sync) and stable, so
thresholds computed from it behave the same on every run.

By default only ``content`` counts, exactly as the pruning contract defines it;
pass ``include_tool_calls=True`` to also count tool-call names and arguments,
which is closer to what the API bills for an assistant message with large
arguments.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from agent.types import Message

CHARS_PER_TOKEN: Final[int] = 4
TOKENS_PER_MESSAGE: Final[int] = 16


def message_chars(message: Message, *, include_tool_calls: bool = False) -> int:
    """Characters of ``message`` that count towards the estimate."""
    chars = len(message.content) if message.content else 0
    if include_tool_calls and message.tool_calls:
        chars += sum(len(call.name) + len(call.arguments) for call in message.tool_calls)
    return chars


def message_tokens(message: Message, *, include_tool_calls: bool = False) -> float:
    """The (fractional) estimate for one message: ``chars / 4 + 16``."""
    return (
        message_chars(message, include_tool_calls=include_tool_calls) / CHARS_PER_TOKEN + TOKENS_PER_MESSAGE
    )


def estimate_tokens_exact(messages: Iterable[Message], *, include_tool_calls: bool = False) -> float:
    """The unrounded sum of :func:`message_tokens`, for threshold comparisons."""
    return sum(message_tokens(m, include_tool_calls=include_tool_calls) for m in messages)


def estimate_tokens(messages: Iterable[Message], *, include_tool_calls: bool = False) -> int:
    """Estimated prompt tokens of ``messages``: sum of ``len(content) / 4 + 16``, rounded up."""
    total = estimate_tokens_exact(messages, include_tool_calls=include_tool_calls)
    whole = int(total)
    return whole if whole == total else whole + 1


def estimate_text_tokens(text: str) -> int:
    """Estimated tokens of a bare string (e.g. a streamed completion), rounded up."""
    return -(-len(text) // CHARS_PER_TOKEN)


def context_usage(prompt_tokens: int | float, context_window: int) -> float:
    """The share of the context window a prompt fills (may exceed 1.0 when it overflows)."""
    if context_window <= 0:
        raise ValueError(f"context_window must be positive, got {context_window}")
    if prompt_tokens < 0:
        raise ValueError(f"prompt_tokens must not be negative, got {prompt_tokens}")
    return prompt_tokens / context_window
