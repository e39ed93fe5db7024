"""Accept, then acknowledge: the bounded, deadline-aware gate every Slack request passes.

Bolt runs with ``process_before_response=True``: a listener submits first (a quick Redis
enqueue) and only then lets bolt acknowledge, so Slack never hears "got it" about an
event that is not stored. When the gateway does not take it (``submit`` answers
``error``, Redis raises, or there is no answer within ``accept_timeout_s``, 2.5 s, well
inside Slack's 3 s) the listener returns :func:`not_accepted` instead: over HTTP that is
a 503 and Slack retries with ``X-Slack-Retry-Num``; in Socket Mode bolt's handler sends
no ack for a non-200, and Slack redelivers the envelope. The submit itself is never
cancelled at the deadline (a half-done ``/new`` must not be cut off): it finishes in the
background, and the redelivery is then answered by the gateway's dedupe.

The gate also owns the channel's background tasks, so stopping can wait for them
(bounded) before closing the HTTP session they use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import structlog
from slack_bolt.response import BoltResponse

from agent.tasks import Slots
from channels.slack.http_events import NOT_ACCEPTED_STATUS
from channels.slack.intake import Outcome

log = structlog.get_logger(__name__)

_T = TypeVar("_T")

Observer = Callable[[str, Outcome], None]


def not_accepted(outcome: Outcome) -> BoltResponse:
    """Bolt's answer for an event the gateway did not take: 503 over HTTP, no ack over the socket."""
    return BoltResponse(
        status=NOT_ACCEPTED_STATUS,
        body={"ok": False, "error": f"not accepted ({outcome.reason}), retry later"},
    )


class AcceptGate:
    """Runs inbound work within a deadline and a concurrency bound; tracks background tasks."""

    def __init__(self, max_concurrent: int, observer: Observer | None = None) -> None:
        self._observer = observer
        self._inflight: set[asyncio.Task[Any]] = set()
        # Events are handled concurrently; a burst must not exhaust the store's connections.
        self._slots = Slots(max_concurrent)

    async def accept(self, kind: str, work: Callable[[], Awaitable[Outcome]], within_s: float) -> Outcome:
        """Run ``work`` (normalize and submit one inbound request) and tell whether it was
        accepted, within ``within_s`` (``accept_timeout_s``, read per request so a settings
        change applies at once).

        Waiting for one of the ``max_concurrent`` slots counts against the deadline.
        ``work`` runs in its own task, shielded: at the deadline the answer is "not
        accepted" (``failed``/``timeout``) but the submit is left to finish (and is logged
        when it does), since cutting a submit off midway could leave it half done. Any
        exception is "not accepted" too.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        outcome: Outcome | None = None
        if not self._slots.take_now():
            try:
                async with asyncio.timeout_at(deadline):
                    await self._slots.take()
            except TimeoutError:
                outcome = Outcome("failed", "busy")
        if outcome is None:
            task = self.spawn(self._holding_slot(kind, work))
            outcome = await self._within(task, deadline)
            if outcome is None:
                outcome = Outcome("failed", "timeout")
                task.add_done_callback(lambda t: self._log_late(kind, t))
        if not outcome.accepted:
            log.warning("slack.not_acknowledged", kind=kind, reason=outcome.reason)
        if self._observer is not None:
            self._observer(kind, outcome)
        return outcome

    @staticmethod
    async def _within(task: asyncio.Task[Outcome], deadline: float) -> Outcome | None:
        """The task's outcome, or None at the deadline; the task is never cancelled.

        One future and one timer: cheaper than ``wait_for(shield(task))`` per event.
        """
        if task.done():
            return task.result()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def wake(_: object = None) -> None:
            if not waiter.done():
                waiter.set_result(None)

        timer = loop.call_at(deadline, wake)
        task.add_done_callback(wake)
        try:
            await waiter
        finally:
            timer.cancel()
            task.remove_done_callback(wake)
        return task.result() if task.done() else None

    async def _holding_slot(self, kind: str, work: Callable[[], Awaitable[Outcome]]) -> Outcome:
        try:
            return await work()
        except Exception as exc:
            log.error("slack.inbound_failed", kind=kind, error=str(exc))
            return Outcome("failed", type(exc).__name__)
        finally:
            self._slots.give()

    @staticmethod
    def _log_late(kind: str, task: asyncio.Task[Outcome]) -> None:
        if not task.cancelled():
            outcome = task.result()
            log.info("slack.inbound_finished_late", kind=kind, status=outcome.status, reason=outcome.reason)

    def spawn(self, work: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
        """A task the channel waits for (bounded) when it stops."""
        task = asyncio.get_running_loop().create_task(work)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return task

    async def drain(self, within_s: float) -> None:
        """Wait (bounded) for inbound requests being handled right now (and their follow-ups)."""
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=within_s)

    def cancel_all(self) -> None:
        """Cancel what :meth:`drain` did not see finish; the session they use is closing."""
        for task in list(self._inflight):
            task.cancel()
