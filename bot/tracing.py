"""Per-run traces: one span per LLM call and per tool call, kept in Redis (the newest 1,000 runs, a week at most).

``TracingModel`` wraps the chat model so every call becomes a span and a metric.

``BOTD_TRACE_VERBOSE=1`` also keeps inputs and outputs, each cut at 50 000 characters.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
import structlog
from pydantic import BaseModel, Field

from agent import notices
from agent.llm_types import ChatModel, DeltaCallback, LLMError, LLMResponse
from agent.types import Message, ToolResultEvent, Usage
from bot import metrics
from bot.store.keys import Keys

log = structlog.get_logger(__name__)

VERBOSE_LIMIT = 50_000
_TTL_S = 7 * 24 * 3600
# The traces kept: the newest runs' (each for a week at most). Older ones are deleted as
# they fall off the index, so the store holds a bounded number however busy the daemon is.
TRACES_KEPT = 1000
FLUSH_AFTER_S = 0.25


def verbose() -> bool:
    return os.environ.get("BOTD_TRACE_VERBOSE", "").strip().lower() in {"1", "true", "yes", "on"}


def clip(text: str, limit: int = VERBOSE_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more chars]"


class Span(BaseModel):
    kind: str  # "llm" | "tool"
    name: str
    start: float
    ms: float = 0.0
    error: str | None = None
    attrs: dict[str, Any] = Field(default_factory=dict)


class Trace(BaseModel):
    run_id: str
    session_key: str
    kind: str
    channel: str
    started_at: float = Field(default_factory=time.time)
    finished_at: float | None = None
    status: str = "running"
    error: str | None = None
    spans: list[Span] = Field(default_factory=list)
    input: str | None = None

    def span(self, kind: str, name: str, start: float, *, error: str | None = None, **attrs: Any) -> Span:
        span = Span(kind=kind, name=name, start=start, ms=round((time.time() - start) * 1000, 2), error=error, attrs=attrs)
        self.spans.append(span)
        return span

    def tool_span(self, event: ToolResultEvent) -> Span:
        """Record a finished tool call; its input and output only when verbose (they may be large or private)."""
        ms = event.duration_ms or 0.0
        failed = event.tool_result.is_error
        attrs: dict[str, Any] = {}
        if verbose():
            attrs = {"input": clip(event.tool_call.arguments), "output": clip(event.tool_result.content or "")}
        span = Span(
            kind="tool", name=event.tool_call.name, start=time.time() - ms / 1000, ms=round(ms, 2),
            error=(event.tool_result.content or "")[:200] if failed else None, attrs=attrs,
        )
        self.spans.append(span)
        return span


class TraceStore:
    """Traces in Redis. ``save`` only queues: the queue is written in one round trip a
    moment later (or on ``flush``, which reads here and ``aclose`` do first), keeping
    the write and its serialization off the run's path."""

    def __init__(self, client: aioredis.Redis, prefix: str, *, flush_after_s: float = FLUSH_AFTER_S) -> None:
        self._r = client
        self._keys = Keys(prefix)
        self._flush_after_s = flush_after_s
        self._pending: dict[str, Trace] = {}
        self._flusher: asyncio.Task[None] | None = None

    def _key(self, run_id: str) -> str:
        return self._keys.trace(run_id)

    async def save(self, trace: Trace) -> None:
        self._pending[trace.run_id] = trace  # a later save of the same run replaces it
        if len(self._pending) > TRACES_KEPT:  # Redis has been failing for a while: keep the newest
            del self._pending[next(iter(self._pending))]
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_soon(), name="trace-flush")

    async def _flush_soon(self) -> None:
        await asyncio.sleep(self._flush_after_s)
        try:
            await self.flush()
        except Exception as exc:  # traces are diagnostics: never let them take a run down
            log.warning("trace.save_failed", error=str(exc), traces=len(self._pending))

    async def flush(self) -> None:
        """Write every queued trace now (one pipeline); on failure they stay queued. The
        traces pushed off the index in that step are deleted next (a process that dies in
        between leaves them to their TTL)."""
        if not self._pending:
            return
        batch = list(self._pending.values())
        pipe = self._r.pipeline(transaction=True)
        index = self._keys.trace_index()
        for trace in batch:
            pipe.set(self._key(trace.run_id), trace.model_dump_json(exclude_defaults=True), ex=_TTL_S)
            pipe.lrem(index, 0, trace.run_id)
            pipe.lpush(index, trace.run_id)
        pipe.lrange(index, TRACES_KEPT, -1)  # read and trimmed in one step: exactly what is cut
        pipe.ltrim(index, 0, TRACES_KEPT - 1)
        *_, dropped, _ = await pipe.execute()
        for trace in batch:
            if self._pending.get(trace.run_id) is trace:
                del self._pending[trace.run_id]
        if dropped:
            await self._r.delete(*(self._key(str(run_id)) for run_id in dropped))

    async def aclose(self) -> None:
        """Stop the background write and write what is still queued."""
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await flusher
        await self.flush()

    async def load(self, run_id: str) -> Trace | None:
        queued = self._pending.get(run_id)
        if queued is not None:
            return queued
        raw = await self._r.get(self._key(run_id))
        return Trace.model_validate_json(raw) if raw else None

    async def recent(self, limit: int = 20) -> list[str]:
        await self.flush()
        return [str(x) for x in await self._r.lrange(self._keys.trace_index(), 0, limit - 1)]


def render_trace(trace: Trace) -> str:
    """Human-readable form for ``botd trace``."""
    lines = [
        f"run {trace.run_id}  {trace.kind} via {trace.channel}  session {trace.session_key}",
        f"status {trace.status}" + (f"  error: {trace.error}" if trace.error else ""),
    ]
    if trace.finished_at:
        lines.append(f"duration {round((trace.finished_at - trace.started_at) * 1000)} ms")
    for span in trace.spans:
        offset = round((span.start - trace.started_at) * 1000)
        attrs = " ".join(f"{k}={v}" for k, v in span.attrs.items() if k not in ("input", "output"))
        err = f"  ERROR {span.error}" if span.error else ""
        lines.append(f"  +{offset:>6} ms  {span.kind:<4} {span.name:<24} {span.ms:>9.1f} ms  {attrs}{err}")
    return "\n".join(lines)


class TracingModel:
    """A ChatModel wrapper that records each LLM call as a trace span and in metrics."""

    def __init__(self, inner: ChatModel, trace: Trace, model_name: str) -> None:
        self._inner = inner
        self._trace = trace
        self._model = model_name
        self.usages: list[Usage] = []
        # The operator's detail of the last failed call ("kind: message"), for the outcome.
        self.failure_detail: str | None = None

    @property
    def last_prompt_tokens(self) -> int:
        return self.usages[-1].prompt_tokens if self.usages else 0

    async def aclose(self) -> None:
        """Nothing to release: the wrapped model outlives the run and its owner closes it."""

    async def complete(
        self, messages: Sequence[Message], tools: list[dict[str, Any]] | None, on_delta: DeltaCallback | None = None
    ) -> LLMResponse:
        start = time.time()
        extra: dict[str, Any] = {}
        if verbose():
            extra["input"] = clip("\n".join(f"{m.role}: {m.content or ''}" for m in messages))
        try:
            response = await self._inner.complete(messages, tools, on_delta)
        except LLMError as exc:
            self.failure_detail = f"{exc.kind}: {exc}"
            self._trace.span("llm", self._model, start, error=self.failure_detail, tools=bool(tools), **extra)
            metrics.LLM_SECONDS.labels(self._model, "error").observe(time.time() - start)
            metrics.LLM_PROBLEMS.labels(exc.kind).inc()
            raise
        usage = response.usage
        self.usages.append(usage)
        if verbose():
            extra["output"] = clip(response.text)
        self._trace.span(
            "llm", self._model, start,
            prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
            estimated=usage.estimated, tool_calls=len(response.tool_calls), attempts=response.attempts,
            tools=bool(tools), finish_reason=response.finish_reason, **extra,
        )
        if response.finish_reason in notices.CUT_NOTICES:
            metrics.LLM_PROBLEMS.labels(response.finish_reason).inc()
        metrics.LLM_SECONDS.labels(self._model, "ok").observe(time.time() - start)
        metrics.TOKENS.labels("prompt").inc(usage.prompt_tokens)
        metrics.TOKENS.labels("completion").inc(usage.completion_tokens)
        return response
