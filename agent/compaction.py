"""Compaction (DESIGN.md §5): keep a long session within the context window.

When a session grows past 50 messages or its prompt fills more than 75% of the
window, the agent first gets one short, tools-limited run to save durable
memories (the *memory flush*), because whatever is only in the conversation is
about to be condensed; then everything but the last few messages is replaced by
a summary. This module is the pure agent side: it decides, runs the flush,
writes the summary and says what to keep. Storing the result atomically is the
caller's job (``bot.compactor``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal

import structlog

from agent.budget import keep_for_target
from agent.compaction_memory import memory_tool_settings, memory_tools
from agent.compaction_summary import SUMMARY_TIMEOUT_S, CompactionError, summarize
from agent.history import prune_tool_results, repair_pairing, summary_messages
from agent.llm_types import ChatModel
from agent.loop import RunCancelled, run_loop
from agent.prompt import PromptSpec, build_system_prompt
from agent.sanitize import is_silent_chat
from agent.tokens import estimate_tokens
from agent.tools.registry import ToolContext, ToolRegistry
from agent.types import Message, RunStatus, ToolPolicy, Usage

__all__ = [
    "FLUSH_TASK",
    "CompactionError",
    "CompactionResult",
    "FlushResult",
    "compact",
    "memory_flush",
    "should_compact",
    "split_for_compaction",
    "summarize",
]

log = structlog.get_logger(__name__)

MAX_MESSAGES: Final[int] = 50  # more than this many stored messages triggers compaction
MAX_WINDOW_SHARE: Final[tuple[int, int]] = (3, 4)  # ... as does a prompt over 3/4 of the window
KEEP_LAST: Final[int] = 4
FLUSH_TIMEOUT_S: Final[float] = 90.0
FLUSH_MAX_ITERATIONS: Final[int] = 5
FLUSH_TASK: Final[str] = "Store durable memories now, if nothing to store reply NO_REPLY."
FLUSH_PROMPT: Final[str] = (
    "Pre-compaction memory flush: the earlier part of this conversation is about to be condensed "
    "into a short summary. Save anything worth keeping beyond it (lasting facts, decisions, "
    "preferences, commitments) to MEMORY.md, or to memory/<topic>.md for details; read a file "
    "before changing it and keep what is already there. Never store secrets. " + FLUSH_TASK
)

# The flush and summary requests use at most this share of the window (the flush sees the
# newest messages, the summary shortens long ones), so they fit even when the conversation
# they condense no longer does.
REQUEST_WINDOW_SHARE: Final[float] = 0.8

FlushStatus = Literal[RunStatus, "timeout"]


def should_compact(message_count: int, last_prompt_tokens: int, context_window: int) -> bool:
    """True when a session has more than 50 messages or its last prompt filled over 75% of the window."""
    if context_window < 1:
        raise ValueError(f"context_window must be positive, got {context_window}")
    if message_count > MAX_MESSAGES:
        return True
    numerator, denominator = MAX_WINDOW_SHARE
    return last_prompt_tokens * denominator > context_window * numerator


def split_for_compaction(
    messages: Sequence[Message], keep_last: int = KEEP_LAST
) -> tuple[list[Message], list[Message]]:
    """``(to_summarize, keep)``: the last ``keep_last`` messages are kept, the rest summarized.

    The kept tail must not start with tool results whose call would be summarized away,
    so the cut moves back to the assistant message that made those calls. When that
    would leave nothing to summarize, it moves forward past the results instead, so the
    whole exchange is summarized.
    """
    if keep_last < 0:
        raise ValueError(f"keep_last must not be negative, got {keep_last}")
    items = list(messages)
    start = max(len(items) - keep_last, 0)
    cut = start
    while 0 < cut < len(items) and items[cut].role == "tool":
        cut -= 1
    if cut == 0 and start > 0:
        cut = start
        while cut < len(items) and items[cut].role == "tool":
            cut += 1
    return items[:cut], items[cut:]


@dataclass
class FlushResult:
    """What the memory flush did. Its messages are for logs and traces, never for the session."""

    status: FlushStatus
    text: str = ""
    silent: bool = False  # it answered NO_REPLY
    writes: int = 0  # successful write_file calls
    iterations: int = 0
    usage: Usage = field(default_factory=Usage)
    messages: list[Message] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        """It ran to its end (possibly storing nothing) rather than failing or timing out."""
        return self.status in ("completed", "max_iterations")


@dataclass
class CompactionResult:
    """The new summary and the messages that stay; ``flushed`` is True when the flush ran to its end."""

    summary: str
    keep: list[Message]
    flushed: bool
    summarized: int = 0  # how many messages the summary replaces
    flush: FlushResult | None = None


async def memory_flush(
    messages: Sequence[Message],
    *,
    model: ChatModel,
    tools: ToolRegistry,
    ctx: ToolContext,
    workspace: Path,
    now: datetime,
    timeout_s: float = FLUSH_TIMEOUT_S,
    max_iterations: int = FLUSH_MAX_ITERATIONS,
    timezone: str = "UTC",
) -> FlushResult:
    """Give the agent one short run to store durable memories from ``messages``.

    It gets the minimal system prompt with the flush task and only ``read_file`` and
    ``write_file`` from ``tools``, confined to MEMORY.md and memory/*.md in
    ``workspace`` and allowed to write there (the caller's policy is replaced). Model
    failures and the timeout come back as the result's status; only cancellation
    of the caller propagates.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    flush_tools = memory_tools(tools)
    flush_ctx = ToolContext(
        run_id=ctx.run_id,
        session_key=ctx.session_key,
        settings=memory_tool_settings(ctx.settings, workspace),
        policy=ToolPolicy(context="scheduled", allow=("write",)),
        chat=dict(ctx.chat),
        extra=ctx.extra,
    )
    spec = PromptSpec(
        workspace=workspace,
        now=now,
        mode="minimal",
        timezone=timezone,
        tools={name: tool.description for name in flush_tools.names() if (tool := flush_tools.get(name))},
        task=FLUSH_TASK,
    )
    conversation = [m for m in messages if m.role != "system"]
    request = [
        Message.system(build_system_prompt(spec)),
        *repair_pairing(conversation),
        Message.user(FLUSH_PROMPT),
    ]
    partial: list[Message] = []

    async def run() -> FlushResult:
        try:
            result = await run_loop(
                request,
                model=model,
                tools=flush_tools,
                ctx=flush_ctx,
                run_id=ctx.run_id,
                max_iterations=max_iterations,
            )
        except RunCancelled as exc:
            # A plain CancelledError, so asyncio.timeout (3.11) can turn its own expiry into TimeoutError.
            partial.extend(exc.result.messages)
            raise asyncio.CancelledError() from None
        return FlushResult(
            status=result.status,
            text=result.text,
            silent=is_silent_chat(result.text),
            writes=_successful_writes(result.messages),
            iterations=result.iterations,
            usage=result.usage,
            messages=result.messages,
            error=result.error,
        )

    try:
        async with asyncio.timeout(timeout_s):
            return await run()
    except TimeoutError:
        return FlushResult(
            status="timeout",
            writes=_successful_writes(partial),
            messages=partial,
            error=f"the memory flush did not finish within {timeout_s:g} s",
        )


def _successful_writes(messages: Sequence[Message]) -> int:
    writes = {c.id for m in messages if m.tool_calls for c in m.tool_calls if c.name == "write_file"}
    return sum(1 for m in messages if m.role == "tool" and m.tool_call_id in writes and not m.is_error)


async def compact(
    messages: Sequence[Message],
    *,
    model: ChatModel,
    tools: ToolRegistry,
    ctx: ToolContext,
    workspace: Path,
    now: datetime,
    previous_summary: str | None = None,
    keep_last: int = KEEP_LAST,
    timezone: str = "UTC",
    context_window_tokens: int | None = None,
    flush: bool = True,
    flush_timeout_s: float = FLUSH_TIMEOUT_S,
    flush_max_iterations: int = FLUSH_MAX_ITERATIONS,
    summary_timeout_s: float = SUMMARY_TIMEOUT_S,
    focus: str | None = None,
) -> CompactionResult:
    """Flush memories, then summarize all but the last ``keep_last`` messages.

    A flush that fails is logged and the summary is still made; a summary that
    fails raises (``LLMError`` or ``CompactionError``) and nothing should be stored.
    ``context_window_tokens``, when given, prunes large tool results in the flush's
    view of the conversation as before any request. ``focus`` tells the summary what
    to pay attention to (``/compact <focus>``).
    """
    to_summarize, keep = split_for_compaction(messages, keep_last)
    if not to_summarize:
        raise CompactionError(f"nothing to summarize: the session has only {len(keep)} messages")
    bound = log.bind(run_id=ctx.run_id, session_key=ctx.session_key)
    flush_result: FlushResult | None = None
    if flush:
        conversation = list(messages)
        head = 0
        if previous_summary and previous_summary.strip():
            conversation = summary_messages(previous_summary.strip()) + conversation
            head = 2
        if context_window_tokens:
            conversation = prune_tool_results(conversation, context_window_tokens)
            conversation = _newest_within(conversation, head, int(context_window_tokens * REQUEST_WINDOW_SHARE))
        flush_result = await _flush(
            bound,
            memory_flush(
                conversation,
                model=model,
                tools=tools,
                ctx=ctx,
                workspace=workspace,
                now=now,
                timeout_s=flush_timeout_s,
                max_iterations=flush_max_iterations,
                timezone=timezone,
            ),
        )
    summary = await summarize(
        to_summarize,
        model=model,
        previous_summary=previous_summary,
        timeout_s=summary_timeout_s,
        focus=focus,
        max_tokens=int(context_window_tokens * REQUEST_WINDOW_SHARE) if context_window_tokens else None,
    )
    return CompactionResult(
        summary=summary,
        keep=keep,
        flushed=flush_result is not None and flush_result.ok,
        summarized=len(to_summarize),
        flush=flush_result,
    )


def _newest_within(messages: list[Message], head: int, allowance: int) -> list[Message]:
    """The first ``head`` messages (the summary pair) and the newest others that fit in ``allowance``."""
    fixed, rest = messages[:head], messages[head:]
    keep = keep_for_target(rest, allowance - estimate_tokens(fixed, include_tool_calls=True))
    return fixed + rest[len(rest) - keep :]


async def _flush(bound: Any, run: Coroutine[Any, Any, FlushResult]) -> FlushResult | None:
    """Await the memory flush; any failure is logged and ends as None or a failed result."""
    try:
        result = await run
    except Exception as exc:
        bound.exception("compaction.flush_crashed", error_type=type(exc).__name__)
        return None
    if result.ok:
        bound.info(
            "compaction.flushed", silent=result.silent, writes=result.writes, iterations=result.iterations
        )
    else:
        bound.warning(
            "compaction.flush_failed", status=result.status, error=result.error, writes=result.writes
        )
    return result
