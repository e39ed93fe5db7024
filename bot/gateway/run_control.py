"""What a run and its owner agree on: the control a run asks of whoever started it
(``session_run.SessionRun``), the outcome it hands back, and the cancellation reasons
after which its batch runs again instead of being recorded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from agent.types import DeliveryStatus, RunRequest, RunStatus
from bot.store.owned import RideAlong
from bot.store.sessions import SessionContext

if TYPE_CHECKING:
    from redis.asyncio.client import Pipeline

# The agent's RunStatus, plus what the gateway decides itself.
OutcomeStatus = Literal[RunStatus, "timeout", "blocked"]

# The reason a run is cancelled to start again with the messages that followed it.
FOLD: Final = "fold"
# Cancellations after which the batch is run again (elsewhere, or folded) rather than recorded.
RETRY_REASONS = frozenset({"shutdown", "lock_lost", FOLD})


class RunControl(Protocol):
    """What a run asks of its owner (``session_run.SessionRun``)."""

    resumed: bool  # a batch a previous attempt left unfinished (it may have saved its result)

    async def steer(self) -> list[RunRequest]:
        """Before every LLM call: messages to hand over now (raises when cancelled)."""
        ...

    # The first steer's reads, queued on the run's first read of the store, and their replies.
    def queue_steer(self, pipe: Pipeline) -> None: ...
    def steer_ahead(self, replies: list[Any]) -> None: ...

    def start_context(self) -> SessionContext | None:
        """The session's context, when it was read with the claim of the batch (then the
        first steer's stop check was too): the run's first read of the store is done."""
        ...

    def acknowledge(self) -> str | None:
        """The run handles its cancellation: stop re-cancelling; returns the reason."""
        ...

    def output_started(self) -> None:
        """Before anything is shown (text, a tool call, the answer); raises when cancelled."""
        ...


@dataclass(frozen=True)
class RunStart:
    """A run's first reads, done in the round trip that claimed its batch."""

    # Decodes the session's context: in the run, not in the intake that answers the platform.
    context: Callable[[], SessionContext]
    stop: str | bytes | None  # the session's stop key, as read with the claim
    read_at: float  # time.monotonic() when the reply came


@dataclass
class RunOutcome:
    run_id: str
    status: OutcomeStatus
    delivery: DeliveryStatus | Literal["none"] = "none"
    error: str | None = None
    text: str = ""
    also: RideAlong | None = None  # writes to ride along the finish of the batch in the inbox

    def wire(self) -> dict[str, Any]:
        """What other replicas are told (``also`` is this process's own business)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "also"}
