"""Per-run traces: one span per LLM call and per tool call, kept in Redis (capped).

``BOTD_TRACE_VERBOSE=1`` also keeps inputs and outputs, each cut at 50 000 characters.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel, Field

from bot.store.keys import Keys

VERBOSE_LIMIT = 50_000
_TTL_S = 7 * 24 * 3600
_INDEX_CAP = 1000


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


class TraceStore:
    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._r = client
        self._keys = Keys(prefix)

    def _key(self, run_id: str) -> str:
        return self._keys.trace(run_id)

    async def save(self, trace: Trace) -> None:
        pipe = self._r.pipeline(transaction=True)
        pipe.set(self._key(trace.run_id), trace.model_dump_json(), ex=_TTL_S)
        index = self._keys.trace_index()
        pipe.lrem(index, 0, trace.run_id)
        pipe.lpush(index, trace.run_id)
        pipe.ltrim(index, 0, _INDEX_CAP - 1)
        await pipe.execute()

    async def load(self, run_id: str) -> Trace | None:
        raw = await self._r.get(self._key(run_id))
        return Trace.model_validate_json(raw) if raw else None

    async def recent(self, limit: int = 20) -> list[str]:
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
