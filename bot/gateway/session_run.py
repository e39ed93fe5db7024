"""One run of a session on this replica (:class:`SessionRun`): its task, why it is being
cancelled (``/stop``, timeout, lost lock, shutdown, a fold), and the steering the agent
loop asks for before every LLM call. The worker creates it; the gateway finds it to stop
or fold it."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import structlog
from redis.asyncio.client import Pipeline

from agent.tasks import keep_cancelling
from agent.types import RunRequest
from bot.gateway.inbox import Inbox, taken
from bot.gateway.run_control import FOLD, RunStart
from bot.gateway.signals import CancelSignals, stopped_since_value
from bot.store.sessions import SessionContext

log = structlog.get_logger(__name__)

# A run started on reads done with the claim of its batch (``RunStart``) has no take with
# its first steer: the claim took everything waiting. That stands for this long after the
# claim; a first steer later than that (a slow start: compaction) takes what came since.
CLAIM_COVERS_TAKE_S = 0.1


class SessionRun:
    """One run of a session on this replica: the task, why it is being cancelled, and
    the steering the agent loop asks for before every LLM call."""

    def __init__(
        self,
        task: asyncio.Task[Any],
        *,
        started_at: float,
        run_id: str,
        session_key: str,
        inbox: Inbox,
        signals: CancelSignals,
        steer_mode: bool,
        fold_window_s: float = 0.0,
        resumed: bool = False,
        start: RunStart | None = None,
    ) -> None:
        self.task = task
        self.resumed = resumed  # a batch a previous attempt left: it may have a saved result
        self.started_at = started_at
        self.run_id = run_id
        self.session_key = session_key
        self.reason: str | None = None
        self._inbox = inbox
        self._signals = signals
        self._steer_mode = steer_mode
        self._acknowledged = False  # the run has seen its cancellation and is cleaning up
        self._nudger: asyncio.Task[None] | None = None
        # Until output starts, a message arriving within the window restarts the run with it.
        self._fold_window_s = fold_window_s
        self._fold_until = time.monotonic() + fold_window_s
        self._output_started = False
        self._ahead: list[Any] | None = None  # the first steer's reads, done ahead (steer_ahead)
        self._ahead_until = math.inf  # in steer mode, the first steer's take stands till then
        self._start_context = None if start is None else start.context
        if start is not None:  # its stop check was read with the claim, which took all waiting
            self._ahead = [start.stop, None]
            self._ahead_until = start.read_at + CLAIM_COVERS_TAKE_S

    def cancel(self, reason: str) -> None:
        """Cancel the run (the first reason wins) and keep cancelling until it notices."""
        if self.task.done() or self._acknowledged:
            return
        self.reason = self.reason or reason
        log.info("run.cancelling", session_key=self.session_key, run_id=self.run_id, reason=reason)
        self.task.cancel()
        if self._nudger is None:
            self._nudger = asyncio.create_task(
                keep_cancelling(self.task, until=lambda: self._acknowledged), name="run-canceller"
            )

    def cancel_if_started_before(self, at: float, reason: str) -> None:
        """A stop at ``at`` applies to this run only when the run had started by then."""
        if self.started_at <= at and self.reason is None:
            self.cancel(reason)

    def fold(self) -> bool:
        """A message for this session arrived: restart the run with it, if nothing has been
        shown yet and it came within the burst window of the previous one. True if so."""
        if self._output_started or self.reason is not None or self.task.done():
            return False
        now = time.monotonic()
        if self._fold_window_s <= 0 or now > self._fold_until:
            return False
        self.cancel(FOLD)
        return True

    def output_started(self) -> None:
        """Called by the run before it shows anything (text, a tool call, the answer):
        from here on a new message is a new turn, never folded into this one."""
        self._output_started = True
        if self.reason is not None:
            raise asyncio.CancelledError  # a pending cancellation must win over showing output

    def shutdown(self) -> None:
        """The replica is stopping: the batch stays queued for a retry elsewhere."""
        self.reason = "shutdown"
        self.task.cancel()

    def acknowledge(self) -> str | None:
        """Called by the run when it handles its cancellation: stop re-cancelling it."""
        self._acknowledged = True
        return self.reason

    def queue_steer(self, pipe: Pipeline) -> None:
        """Queue the next :meth:`steer`'s reads on ``pipe`` (the run's first read of the
        store), so that steer needs no round trip; their replies go to :meth:`steer_ahead`."""
        pipe.get(self._signals.key(self.session_key))
        if self._steer_mode:
            self._inbox.queue_take(pipe, self.session_key)

    def steer_ahead(self, replies: list[Any]) -> None:
        self._ahead, self._ahead_until = replies, math.inf

    def start_context(self) -> SessionContext | None:
        decode, self._start_context = self._start_context, None
        return None if decode is None else decode()

    async def steer(self) -> list[RunRequest]:
        """Called before every LLM call: notice a missed /stop, hand over steered messages."""
        requests: list[RunRequest] = []
        ahead, self._ahead = self._ahead, None
        if ahead is not None and self._steer_mode and time.monotonic() > self._ahead_until:
            ahead = None  # claimed too long ago to stand for a take: take what came since below
        if ahead is not None:  # read with the run's context (or its claim)
            stopped = stopped_since_value(ahead[0], self.started_at)
            requests = taken(ahead[1]) if self._steer_mode else []
        elif self._steer_mode:  # the stop check and the take in one round trip
            requests, raw = await self._inbox.take_reading(self.session_key, self._signals.key(self.session_key))
            stopped = stopped_since_value(raw, self.started_at)
        else:
            stopped = await self._signals.stopped_since(self.session_key, self.started_at)
        if self.reason is None and stopped:
            self.cancel("stopped")
            await asyncio.sleep(0)  # takes the cancellation just requested of this very task
        if self.reason is not None:
            # A cancellation may have been swallowed by a Redis call above: honour it here.
            raise asyncio.CancelledError
        return requests

    def close(self) -> None:
        if self._nudger is not None:
            self._nudger.cancel()
