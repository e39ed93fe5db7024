"""What the scheduler needs from the daemon, as small Protocols the daemon implements.

The scheduler never imports ``bot`` or ``channels``: a fire becomes a
:class:`~agent.types.RunRequest` that the daemon's :class:`ScheduledRunner` pushes
through the same gateway path as a chat message (session lock, agent loop,
sanitize, silent-reply checks, delivery) and answers with a
:class:`ScheduledOutcome`.

Session keys are built by the daemon too; the scheduler receives them as
arguments: ``session_key_for_job(job_id)`` returning ``agent:<id>:cron:<job_id>``
and the heartbeat key ``agent:<id>:heartbeat`` (DESIGN.md §4.3).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent.types import DeliveryStatus, RunRequest

ScheduledRunStatus = Literal["ok", "error", "skipped", "timeout"]
TargetChannel = Literal["telegram", "slack", "console"]

RUN_STATUSES: tuple[ScheduledRunStatus, ...] = get_args(ScheduledRunStatus)
DELIVERY_STATUSES: tuple[DeliveryStatus, ...] = get_args(DeliveryStatus)


class JobTarget(BaseModel):
    """A chat a scheduled run delivers to (and where a job's notices go)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    channel: TargetChannel
    chat_id: str = Field(min_length=1, max_length=256)
    thread_id: str | None = Field(default=None, max_length=256)

    @field_validator("chat_id", "thread_id", mode="before")
    @classmethod
    def _as_text(cls, value: object) -> object:
        # Telegram chat ids arrive as ints from YAML/JSON; keep them as text.
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    def same_chat(self, other: JobTarget) -> bool:
        """Same channel and chat; the thread does not matter for ownership."""
        return self.channel == other.channel and self.chat_id == other.chat_id

    def describe(self) -> str:
        where = f"{self.channel} chat {self.chat_id}"
        return f"{where} (thread {self.thread_id})" if self.thread_id else where


@dataclass(frozen=True)
class ScheduledOutcome:
    """How a scheduled run went; ``run_status`` and ``delivery_status`` are independent.

    A delivery failure does not make a run fail (the run did its work); NO_REPLY
    output is ``silent``; ``unknown`` when the gateway could not tell.
    """

    run_id: str
    run_status: ScheduledRunStatus
    delivery_status: DeliveryStatus = "unknown"
    error: str | None = None


class ScheduledRunner(Protocol):
    """The daemon side of a fire."""

    async def run_scheduled(self, request: RunRequest, *, timeout_s: float) -> ScheduledOutcome:
        """Run ``request`` through the gateway and wait for it (at most ``timeout_s``).

        ``request.meta["fresh_session"] == "1"`` asks for the session to be reset first
        (every cron run starts clean). Expected failures come back as an outcome;
        an exception is recorded as ``error``.
        """
        ...

    async def is_busy(self, session_key: str) -> bool:
        """True while a run holds ``session_key`` or its inbox is non-empty (heartbeat deferral)."""
        ...

    async def notify(self, target: JobTarget, text: str) -> None:
        """Send a plain notice to a chat (e.g. a job was disabled); not a run, no LLM."""
        ...


class CronKeys(Protocol):
    """The scheduler's Redis key families; the daemon passes its key registry
    (``bot.store.keys.Keys``), so every key botd uses is built in one place."""

    def fire(self, job_id: str, fire_time: str) -> str:
        """The claim of one fire; ``fire_time`` in the canonical UTC form."""
        ...

    def cron_job(self, job_id: str) -> str: ...
    def cron_jobs(self) -> str: ...
    def cron_changes(self) -> str: ...
    def cron_last_fire(self) -> str: ...
    def cron_running(self, job_id: str) -> str: ...
    def cron_runs(self, job_id: str) -> str: ...
    def cron_run_now(self) -> str: ...
    def cron_run_now_taken(self, op_id: str) -> str: ...


class OwnedKeys(Protocol):
    """Owner-checked takes and deletes (the daemon's ``bot.store.owned.OwnedKeys``), so
    the scheduler uses the store's compare-and-set scripts instead of copies of them."""

    async def acquire(self, key: str, token: str, ttl_s: float) -> bool:
        """Set ``key`` to ``token`` for ``ttl_s`` unless another token holds it: a request
        sent again after its reply was lost still reads as taken."""
        ...

    async def delete_if_owner(self, key: str, token: str) -> bool:
        """Delete ``key`` if it still holds ``token``; True when it was deleted."""
        ...


class Subscriber(Protocol):
    """The process's one pub/sub listener (the daemon's ``Broadcast``).

    Pub/sub delivers only while connected: a subscriber that must not miss a change
    also registers ``on_reconnect`` to resync from the store.
    """

    def on(self, channel: str, handler: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        """Call ``handler`` with every JSON object published on ``channel``."""
        ...

    def on_reconnect(self, handler: Callable[[], Awaitable[None]]) -> None:
        """Call ``handler`` after the listener subscribed again following a lost connection."""
        ...


class GrantSeal(Protocol):
    """MACs a cron job's grants with a key the store never holds (the daemon implements it)."""

    def sign(self, *fields: str) -> str: ...

    def verify(self, mac: object, *fields: str) -> bool: ...
