"""The gateway: ``submit()`` for every inbound request, one worker per busy session.

submit: dedupe and enqueue atomically → control commands answered at once → a local
worker is started for the session. A worker runs only while it holds the session's
Redis lock, so a session never has two runs at once across replicas; different
sessions run concurrently up to ``gateway.max_concurrent_runs`` per replica. A sweeper
on every replica picks up sessions whose work nobody is serving (a replica died, or a
message arrived while the last holder was releasing).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from agent.types import RunRequest
from bot import metrics
from bot.config import BotdConfig
from bot.gateway.broadcast import Broadcast
from bot.gateway.cancel import CancelSignals, server_time
from bot.gateway.commands import parse_command
from bot.gateway.control import ControlCommands
from bot.gateway.delivery import DeliveryLedger
from bot.gateway.inbox import Inbox, describe
from bot.gateway.outcomes import OutcomeBoard
from bot.gateway.reply import notify
from bot.gateway.runner import RETRY_REASONS, RunExecutor, RunOutcome
from bot.store.keys import Keys
from bot.store.locks import SessionLock
from bot.tasks import RETRY_S, stop_task
from channels.base import ChannelAdapter, SubmitResult, Target

log = structlog.get_logger(__name__)

SWEEP_INTERVAL_S = 1.0
MAX_ATTEMPTS = 3


@dataclass
class ActiveRun:
    task: asyncio.Task[Any]
    started_at: float
    run_id: str
    reason: str | None = None
    acknowledged: bool = False  # the run has seen its cancellation and is cleaning up
    nudger: asyncio.Task[None] | None = None

    def acknowledge(self) -> str | None:
        """Called by the run when it handles its cancellation: stop re-cancelling it."""
        self.acknowledged = True
        return self.reason


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
        lock_factory: Callable[[str, Callable[[], None]], SessionLock],
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
        self._lock_factory = lock_factory
        self._keys = Keys(prefix)
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._active: dict[str, ActiveRun] = {}
        self._slots = asyncio.Semaphore(cfg.gateway.max_concurrent_runs)
        self._closing = False
        self._sweeper: asyncio.Task[None] | None = None
        broadcast.on(self.cancel.channel, self._on_cancel)

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Start sweeping; call after ``broadcast.start()`` wiring is complete."""
        self._sweeper = asyncio.create_task(self._sweep(), name="gateway-sweeper")

    async def shutdown(self, grace_s: float) -> None:
        """Stop taking work, let runs finish for ``grace_s``, then cancel the rest.

        Cancelled runs leave their messages in Redis, so another replica (or the next
        start) runs them again: nothing accepted is lost.
        """
        self._closing = True
        await stop_task(self._sweeper)
        workers = list(self._workers.values())
        if workers:
            _, pending = await asyncio.wait(workers, timeout=grace_s)
            for active in self._active.values():
                active.reason = "shutdown"
                active.task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=10)

    # ---- intake ------------------------------------------------------------------------

    async def submit(self, req: RunRequest) -> SubmitResult:
        """Accept a request; never waits for the run. ``error`` means: not accepted, retry later."""
        if self._closing:
            return SubmitResult("error", "shutting down")
        try:
            command = parse_command(req.text) if req.kind == "chat" else None
            if command is not None:
                if req.dedupe_key and not await self.control.first_time(req.dedupe_key):
                    metrics.DEDUPE_HITS.labels(req.channel).inc()
                    return SubmitResult("duplicate")
                try:
                    await self.control.handle(command, req, self)
                except RedisError:
                    # Not done: let the platform's retry through instead of calling it a duplicate.
                    if req.dedupe_key:
                        with contextlib.suppress(RedisError):
                            await self.control.forget(req.dedupe_key)
                    raise
                return SubmitResult("command", command.name)
            enqueued = await self.inbox.enqueue(req, self.cfg.queue.cap, dedupe_key=req.dedupe_key)
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
        self._kick(req.session_key)
        return SubmitResult("queued")

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
        if session_key in self._active:
            return True
        return bool(await self._r.exists(self._keys.lock(session_key)))

    def busy_locally(self) -> bool:
        return bool(self._workers)

    def active_run(self, session_key: str) -> ActiveRun | None:
        return self._active.get(session_key)

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
        await self._cancel_if_started_before(session_key, at, "stopped")

    async def _on_cancel(self, data: dict[str, Any]) -> None:
        await self._cancel_if_started_before(str(data["session"]), float(data["at"]), "stopped")

    async def _cancel_if_started_before(self, session_key: str, at: float, reason: str) -> None:
        active = self._active.get(session_key)
        if active is not None and active.started_at <= at and active.reason is None:
            self._cancel_local(session_key, reason)

    def _cancel_local(self, session_key: str, reason: str) -> None:
        active = self._active.get(session_key)
        if active is None or active.task.done() or active.acknowledged:
            return
        active.reason = active.reason or reason
        log.info("run.cancelling", session_key=session_key, run_id=active.run_id, reason=reason)
        active.task.cancel()
        if active.nudger is None:
            active.nudger = asyncio.create_task(self._keep_cancelling(active), name="run-canceller")

    @staticmethod
    async def _keep_cancelling(active: ActiveRun) -> None:
        """Repeat the cancellation until the run acknowledges it (see bot.tasks)."""
        for _ in range(100):
            await asyncio.sleep(RETRY_S)
            if active.task.done() or active.acknowledged:
                return
            active.task.cancel()

    # ---- workers -----------------------------------------------------------------------

    def _kick(self, session_key: str) -> None:
        if self._closing or session_key in self._workers:
            return
        task = asyncio.create_task(self._serve(session_key), name=f"session:{session_key}")
        self._workers[session_key] = task
        task.add_done_callback(lambda done: self._forget_worker(session_key, done))

    def _forget_worker(self, session_key: str, task: asyncio.Task[Any] | None) -> None:
        # A worker may have started its successor before it ended: only forget itself.
        if self._workers.get(session_key) is task:
            del self._workers[session_key]

    async def _serve(self, session_key: str) -> None:
        held = False
        try:
            async with self._slots:
                lock = self._lock_factory(session_key, lambda: self._cancel_local(session_key, "lock_lost"))
                if not await lock.acquire(wait=False):
                    return
                held = True
                try:
                    await self._drain(session_key, lock)
                finally:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(lock.release())
        except RedisError as exc:
            log.warning("worker.store_error", session_key=session_key, error=str(exc))
            return
        finally:
            self._forget_worker(session_key, asyncio.current_task())
        # A message may have arrived while we were releasing: its submitter saw the lock held.
        if held and not self._closing:
            with contextlib.suppress(RedisError):
                if await self.inbox.waiting(session_key) or await self.inbox.running(session_key):
                    self._kick(session_key)

    async def _drain(self, session_key: str, lock: SessionLock) -> None:
        """Run the session's batches while holding its lock.

        Stops when the lock is no longer held (a run only notices a lost lock while it is
        registered as active; between runs this check does it), and after a batch when
        other sessions wait for a run slot, so one busy chat cannot keep a slot forever:
        the worker then goes to the back of the queue.
        """
        first = True
        while not self._closing:
            if not lock.is_held:
                log.warning("worker.lock_lost_between_runs", session_key=session_key)
                return
            batch = await self.inbox.running(session_key)
            if batch:
                batch = await self._retry_guard(session_key, batch)
            else:
                if first:
                    await self._debounce(session_key)
                    if self._closing:
                        return  # shutting down: leave the messages waiting for the next replica
                batch = await self.inbox.take(session_key)
            first = False
            if not batch:
                await self.inbox.finish(session_key)
                return
            outcome = await self._run(session_key, batch, lock)
            if outcome is None:
                return  # left for a retry (shutdown, lock lost, store error)
            if not await self.inbox.finish(session_key):
                return
            if self._slots.locked():
                return  # others are waiting for a slot; the re-kick in _serve requeues us

    async def _retry_guard(self, session_key: str, batch: list[RunRequest]) -> list[RunRequest]:
        """Resume a batch a previous holder left; give up on it after MAX_ATTEMPTS."""
        key = self._keys.key("attempts", batch[0].run_id)
        pipe = self._r.pipeline(transaction=True)
        pipe.incr(key)
        pipe.expire(key, 86400)
        attempts, _ = await pipe.execute()
        log.info("run.resuming", session_key=session_key, run_id=batch[0].run_id, attempt=attempts)
        if attempts <= MAX_ATTEMPTS:
            return batch
        log.error("run.abandoned", session_key=session_key, run_id=batch[0].run_id, attempts=attempts)
        channel = self.channels.get(batch[-1].channel)
        if channel is not None:
            await notify(channel, Target.of(batch[-1]), self.ledger, batch[0].run_id, "abandoned",
                         "Sorry — I could not process your message after several attempts. Please send it again.")
        await self.inbox.finish(session_key)
        return await self.inbox.take(session_key)

    async def _debounce(self, session_key: str) -> None:
        delay = self.cfg.queue.debounce_ms / 1000
        if delay <= 0:
            return
        head = await self.inbox.peek(session_key)
        if head is None or head.kind != "chat":
            return
        seen = await self.inbox.waiting(session_key)
        for _ in range(10):
            await asyncio.sleep(delay)
            now = await self.inbox.waiting(session_key)
            if now == seen:
                return
            seen = now

    async def _steer(self, session_key: str, active: ActiveRun) -> list[RunRequest]:
        """Called before every LLM call: notice a missed /stop, hand over steered messages."""
        if active.reason is None and await self.cancel.stopped_since(session_key, active.started_at):
            self._cancel_local(session_key, "stopped")
        taken = await self.inbox.take(session_key) if self.cfg.queue.mode == "steer" else []
        if active.reason is not None:
            # A cancellation may have been swallowed by a Redis call above: honour it here.
            raise asyncio.CancelledError
        return taken

    async def _run(self, session_key: str, batch: list[RunRequest], lock: SessionLock) -> RunOutcome | None:
        task = asyncio.current_task()
        assert task is not None
        active = ActiveRun(task=task, started_at=await server_time(self._r), run_id=batch[0].run_id)
        self._active[session_key] = active
        if not lock.is_held:  # lost while we were registering: on_lost found nothing to cancel
            self._active.pop(session_key, None)
            return None
        timeout = float(batch[0].meta.get("timeout_s") or self.cfg.gateway.run_timeout_s)
        timer = asyncio.get_running_loop().call_later(timeout, self._cancel_local, session_key, "timeout")
        outcome: RunOutcome | None
        try:
            outcome = await self.executor.execute(
                batch, steer=lambda: self._steer(session_key, active), cancel_reason=active.acknowledge
            )
        except asyncio.CancelledError:
            if active.reason is None:
                raise  # not ours: the caller is cancelling the worker itself
            active.acknowledge()
            while task.cancelling():
                task.uncancel()
            outcome = RunOutcome(active.run_id, "cancelled", "none", active.reason)
        except RedisError as exc:
            log.error("run.store_error", session_key=session_key, run_id=active.run_id, error=str(exc))
            outcome = None
        finally:
            timer.cancel()
            self._active.pop(session_key, None)
            if active.nudger is not None:
                active.nudger.cancel()
        if outcome is not None and active.reason in RETRY_REASONS:
            outcome = None
        if outcome is not None:
            with contextlib.suppress(RedisError):
                await self.outcomes.publish([r.run_id for r in batch if r.kind != "chat"], outcome)
        return outcome

    # ---- sweeping ----------------------------------------------------------------------

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                sessions = await self.inbox.pending_sessions(older_than_s=SWEEP_INTERVAL_S)
                metrics.QUEUE_DEPTH.set(await self.inbox.depth())
            except RedisError as exc:
                log.warning("sweeper.store_error", error=str(exc))
                continue
            for session_key in sessions:
                if session_key not in self._active:
                    self._kick(session_key)
