"""The gateway: ``submit()`` for every inbound request (DESIGN.md §2's intake).

submit: control commands answered at once (deduplicated) → dedupe and enqueue
atomically → a local worker is started for the session (``worker.py`` serves it).
Everything a channel or the scheduler asks of the daemon goes through here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from agent.types import RunRequest
from bot import metrics
from bot.config import BotdConfig
from bot.gateway.control import Command, ControlCommands, parse_command
from bot.gateway.inbox import Deduper, EnqueueResult, Inbox, describe
from bot.gateway.reply import DeliveryLedger, notify
from bot.gateway.run import RunExecutor
from bot.gateway.session_run import SessionRun
from bot.gateway.signals import Broadcast, CancelSignals, OutcomeBoard
from bot.gateway.worker import LockFactory, Workers
from bot.store.keys import Keys
from bot.store.locks import SessionLock
from channels.base import ChannelAdapter, SubmitResult, Target

log = structlog.get_logger(__name__)


class Gateway:
    def __init__(
        self,
        cfg: BotdConfig,
        client: aioredis.Redis,
        executor: RunExecutor,
        channels: Mapping[str, ChannelAdapter],
        broadcast: Broadcast,
        ledger: DeliveryLedger,
        control: ControlCommands,
        lock_factory: LockFactory,
    ) -> None:
        prefix = cfg.redis.prefix
        self.cfg = cfg
        self._r = client
        self.executor = executor
        self.channels = channels
        self.inbox = Inbox(client, prefix)
        self.broadcast = broadcast
        self.cancel = CancelSignals(client, prefix, broadcast)
        self.outcomes = OutcomeBoard(client, prefix, broadcast)
        self.ledger = ledger
        self.control = control
        self._keys = Keys(prefix)
        self._lock_factory = lock_factory
        self.dedupe = Deduper(client, self._keys)
        self.workers = Workers(
            cfg, client, executor, channels, self.inbox, self.cancel, self.outcomes, ledger, lock_factory
        )
        self._closing = False
        broadcast.on(self.cancel.channel, self._on_cancel)

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Start sweeping; call after ``broadcast.start()`` wiring is complete."""
        self.workers.start()

    async def shutdown(self, grace_s: float) -> None:
        """Stop taking work, let runs finish for ``grace_s``, then cancel the rest.

        Cancelled runs leave their messages in Redis, so another replica (or the next
        start) runs them again: nothing accepted is lost.
        """
        self._closing = True
        await self.control.aclose()
        await self.workers.shutdown(grace_s)

    # ---- intake ------------------------------------------------------------------------

    async def submit(self, req: RunRequest) -> SubmitResult:
        """Accept a request; never waits for the run. ``error`` means: not accepted, retry later."""
        if self._closing:
            return SubmitResult("error", "shutting down")
        try:
            command = parse_command(req.text) if req.kind == "chat" else None
            if command is not None:
                return await self._command(command, req)
            enqueued, kicked = await self._enqueue(req)
        except RedisError as exc:
            log.error("submit.store_unavailable", error=str(exc), session_key=req.session_key)
            return SubmitResult("error", "store unavailable")
        if enqueued.duplicate:
            metrics.DEDUPE_HITS.labels(req.channel).inc()
            return SubmitResult("duplicate")
        try:
            for dropped in enqueued.dropped:
                metrics.INBOX_DROPS.inc()
                await self._tell_dropped(dropped)
            # Interrupt: the queued message must not wait for the run that is already going.
            if self.cfg.queue.mode == "interrupt" and req.kind == "chat" and await self.is_running(req.session_key):
                await self.cancel.request(req.session_key)
        except RedisError as exc:
            log.warning("submit.after_enqueue_failed", error=str(exc), session_key=req.session_key)
        if not kicked:
            self.workers.kick(req.session_key)
        if req.kind == "chat" and self.workers.fold(req.session_key):
            log.info("submit.folded", session_key=req.session_key, run_id=req.run_id)
        return SubmitResult("queued")

    async def _enqueue(self, req: RunRequest) -> tuple[EnqueueResult, bool]:
        """Queue ``req``; when this replica can serve its session at once, also take the
        session's lock and batch in the same round trip and start the worker on them (True).
        Not in interrupt mode: its check for a running session must not find that lock."""
        cap, dedupe_key = self.cfg.queue.cap, req.dedupe_key
        lock = self.workers.claim_lock(req.session_key) if self.cfg.queue.mode != "interrupt" else None
        if lock is None:
            return await self.inbox.enqueue(req, cap, dedupe_key=dedupe_key), False
        claim = None
        try:
            enqueued, claim = await self.inbox.enqueue_and_claim(
                req, cap, lock, dedupe_key=dedupe_key, ahead=self.workers.read_ahead(req.session_key)
            )
        finally:
            self.workers.claim_returned(req.session_key, lock, claim)
        return enqueued, claim is not None

    async def _command(self, command: Command, req: RunRequest) -> SubmitResult:
        """Handle a control command once per dedupe key (see ``inbox.Deduper``)."""
        claim = await self.dedupe.claim(req.dedupe_key) if req.dedupe_key else None
        if claim is not None and claim.status == "duplicate":
            metrics.DEDUPE_HITS.labels(req.channel).inc()
            return SubmitResult("duplicate")
        if claim is not None and claim.status == "in_flight":
            return SubmitResult("error", "the same event is still being handled")
        try:
            await self.control.handle(command, req, self)
        except RedisError:
            # Not done: let the platform's retry through instead of calling it a duplicate.
            if claim is not None:
                with contextlib.suppress(RedisError):
                    await self.dedupe.release(claim)
            raise
        except Exception:
            # A fault of the command, not of the store: a redelivery would only repeat it.
            if claim is not None:
                with contextlib.suppress(RedisError):
                    await self.dedupe.confirm(claim)
            raise
        if claim is not None:
            try:
                await self.dedupe.confirm(claim)
            except RedisError as exc:  # handled all the same; the pending mark expires
                log.warning("submit.dedupe_confirm_failed", error=str(exc), session_key=req.session_key)
        return SubmitResult("command", command.name)

    async def _tell_dropped(self, dropped: RunRequest) -> None:
        channel = self.channels.get(dropped.channel)
        if channel is None:
            return
        text = (
            f"Too many messages were waiting ({self.cfg.queue.cap}); this one was dropped: "
            f"{describe(dropped)}. Please send it again if it still matters."
        )
        await notify(channel, Target.of(dropped), self.ledger, dropped.run_id, "dropped", text)

    # ---- questions the rest of the daemon asks ------------------------------------------

    async def is_busy(self, session_key: str) -> bool:
        """A run holds the session lock, or messages are waiting for it."""
        return await self.is_running(session_key) or await self.inbox.waiting(session_key) > 0

    async def is_running(self, session_key: str) -> bool:
        """Some replica holds the session lock (a run is in progress or starting)."""
        if session_key in self.workers.active:
            return True
        return bool(await self._r.exists(self._keys.lock(session_key)))

    def session_lock(self, session_key: str, on_lost: Callable[[], None]) -> SessionLock:
        """The session's run lock, for work that must not overlap a run (``/compact``)."""
        return self._lock_factory(session_key, on_lost)

    def kick(self, session_key: str) -> None:
        """Serve the session now (its messages may have waited for the lock)."""
        if not self._closing:
            self.workers.kick(session_key)

    def busy_locally(self) -> bool:
        return self.workers.busy()

    def active_run(self, session_key: str) -> SessionRun | None:
        return self.workers.active.get(session_key)

    async def wait_not_running(self, session_key: str, timeout_s: float) -> bool:
        """Wait until no replica runs the session (a stopped run has recorded what it keeps);
        False when it still runs after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while await self.is_running(session_key):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    # ---- stopping ----------------------------------------------------------------------

    async def stop_session(self, session_key: str) -> None:
        """Cancel the session's active run on whichever replica runs it."""
        at = await self.cancel.request(session_key)
        self._cancel_if_started_before(session_key, at)

    async def _on_cancel(self, data: dict[str, Any]) -> None:
        self._cancel_if_started_before(str(data["session"]), float(data["at"]))

    def _cancel_if_started_before(self, session_key: str, at: float) -> None:
        self.workers.stop(session_key, at)
