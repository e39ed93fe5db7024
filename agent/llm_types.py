"""The contract between the agent loop and a chat model.

The loop depends only on the ``ChatModel`` protocol, so any object with a matching
``complete`` (the OpenAI-compatible ``LLMClient``, a test double, another provider)
can drive a run.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from agent.types import Message, ToolCall, Usage

# "incomplete": the answer ended without a finish reason (cut); "empty": no answer at all.
LLMErrorKind = Literal[
    "rate_limit", "server", "connection", "timeout", "auth", "not_found", "bad_request", "stream", "protocol",
    "incomplete", "empty",
]


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """A piece of the answer as it streams in: visible text or reasoning."""

    kind: Literal["text", "reasoning"]
    text: str


DeltaCallback = Callable[[StreamDelta], Awaitable[None]]


@dataclass
class LLMResponse:
    """One complete model answer: ``finish_reason`` is always set (``length`` and
    ``content_filter`` answers are complete calls whose text may be cut)."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    model: str = ""
    attempts: int = 1


class LLMError(Exception):
    """A model call that failed for good.

    ``str(err)`` is the operator's detail (status, config key, the server's words with
    anything key-like masked): for logs, traces and ``botd doctor``, not for a chat;
    ``agent.notices.failure_notice`` turns an error into what a chat user is told.
    ``kind`` says what went wrong, ``retryable`` whether trying again later may help,
    ``status`` is the HTTP status when there was one, ``retry_after_s`` the server's
    requested wait, ``started`` whether visible text had already streamed out (then a
    retry would show the user a second answer), ``context_exceeded`` whether the
    request was refused for being longer than the model's context.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: LLMErrorKind,
        retryable: bool,
        status: int | None = None,
        retry_after_s: float | None = None,
        started: bool = False,
        context_exceeded: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind: LLMErrorKind = kind
        self.retryable = retryable
        self.status = status
        self.retry_after_s = retry_after_s
        self.started = started
        self.context_exceeded = context_exceeded

    def __repr__(self) -> str:
        return (
            f"LLMError({self.message!r}, kind={self.kind!r}, retryable={self.retryable}, status={self.status}, "
            f"started={self.started})"
        )


class ChatModel(Protocol):
    """Anything that can answer a conversation, optionally with tool calls.

    Its owner calls ``aclose`` once at shutdown to release connections; a model that
    holds none (a test double, a per-run wrapper) makes it a no-op.
    """

    async def complete(
        self,
        messages: Sequence[Message],
        tools: list[dict[str, Any]] | None,
        on_delta: DeltaCallback | None = None,
    ) -> LLMResponse:
        """Answer ``messages``; stream pieces to ``on_delta``; raise ``LLMError`` on failure."""
        ...

    async def aclose(self) -> None:
        """Release what the model holds (HTTP connection pools); called once by its owner."""
        ...


CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 16


def estimate_text_tokens(text: str) -> int:
    """Tokens in ``text`` by the 4-characters-per-token rule (rounded up)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def estimate_tokens(messages: Sequence[Message]) -> int:
    """Prompt tokens of ``messages`` when the API reports none: 4 chars per token plus 16 per message.

    Counts what is sent: contents and tool-call names and arguments (reasoning stays local).
    """
    chars = 0
    for m in messages:
        chars += len(m.content or "")
        for call in m.tool_calls or ():
            chars += len(call.name) + len(call.arguments)
    return math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages)
