"""What ``/status``, ``/usage`` and ``botd sessions`` report about a session, read from
its meta hash (the counters the session scripts keep)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field


class SessionUsage(BaseModel):
    """Tokens of the last LLM call, of the last run, and totals since the session began
    (totals survive /new). Costs are None until a priced model was used."""

    last_prompt_tokens: int = 0
    last_completion_tokens: int = 0
    total_prompt_tokens: int = 0
    total_completion_tokens: int = 0
    last_run_prompt_tokens: int = 0
    last_run_completion_tokens: int = 0
    last_run_cost: float | None = None
    total_cost: float | None = None


class SessionInfo(BaseModel):
    """What ``botd sessions show`` and ``/status`` report about one session."""

    session_key: str
    exists: bool
    message_count: int = 0
    created_at: float | None = None
    last_activity: float | None = None
    summary_present: bool = False
    compactions: int = 0
    resets: int = 0
    trimmed: int = 0  # messages dropped by the length cap since the last reset
    version: int = 0
    usage: SessionUsage = Field(default_factory=SessionUsage)


class SessionPage(BaseModel):
    """One page of sessions, most recently active first; ``next_cursor`` None on the last page."""

    sessions: list[SessionInfo]
    next_cursor: int | None


_COUNTS = ("last_prompt_tokens", "last_completion_tokens", "total_prompt_tokens", "total_completion_tokens",
           "last_run_prompt_tokens", "last_run_completion_tokens")


def usage_of(meta: Mapping[Any, Any]) -> SessionUsage:
    counts = {name: int(meta.get(name, 0)) for name in _COUNTS}
    return SessionUsage(**counts, last_run_cost=_float(meta.get("last_run_cost")), total_cost=_float(meta.get("total_cost")))


def _float(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def info_of(session_key: str, count: int, meta: Mapping[Any, Any], has_summary: bool) -> SessionInfo:
    return SessionInfo(
        session_key=session_key,
        exists=bool(meta) or count > 0,
        message_count=count,
        created_at=_float(meta.get("created_at")),
        last_activity=_float(meta.get("last_activity")),
        summary_present=has_summary,
        compactions=int(meta.get("compactions", 0)),
        resets=int(meta.get("resets", 0)),
        trimmed=int(meta.get("trimmed", 0)),
        version=int(meta.get("version", 0)),
        usage=usage_of(meta),
    )
