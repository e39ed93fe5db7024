"""Serving a session: take its lock, drain its inbox batch by batch, run each batch, and
sweep for sessions nobody serves.

A worker runs only while it holds the session's Redis lock, so a session never has two
runs at once across replicas; different sessions run concurrently up to
``gateway.max_concurrent_runs`` per replica. A sweeper on every replica picks up
sessions whose work nobody is serving (a replica died, or a message arrived while the
last holder was releasing). Each run is a :class:`~bot.gateway.session_run.SessionRun`,
which owns its cancellation and its steering.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Literal

import redis.asyncio as aioredis
import structlog
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from agent.tasks import Slots, stop_task, uncancel_current
from agent.types import RunRequest
from bot import metrics
from bot.config import BotdConfig
from bot.gateway.inbox import Claim, Inbox, ReadAhead
from bot.gateway.reply import DeliveryLedger, notify
from bot.gateway.run import RunExecutor
from bot.gateway.run_control import FOLD, RETRY_REASONS, RunOutcome, RunStart
from bot.gateway.session_run import SessionRun
from bot.gateway.signals import CancelSignals, OutcomeBoard, server_time
from bot.store.keys import Keys
from bot.store.locks import SessionLock
from bot.store.owned import RideAlong
from channels.base import ChannelAdapter, Target

log = structlog.get_logger(__name__)

SWEEP_INTERVAL_S = 1.0
# After a sweep that found no work waiting anywhere, with nothing kicked here since, the
# next one is this far off: new work is kicked and swept every second by the replica it
# arrived on, so a quiet replica's sweep only stands in for one that died right after
# taking a message (whose lock, if it held one, outlives this anyway).
QUIET_SWEEP_INTERVAL_S = 5.0
MAX_ATTEMPTS = 3
# How long the items of an album (one message per file) are waited for to make one run.
MEDIA_GROUP_WAIT_S = 1.0

LockFactory = Callable[[str, Callable[[], None]], SessionLock]


class Workers:
    """This replica's session workers and its sweeper."""

    def __init__(
        self,
        cfg: BotdConfig,
        client: aioredis.Redis,
        executor: RunExecutor,
        channels: Mapping[str, ChannelAdapter],
        inbox: Inbox,
        signals: CancelSignals,
        outcomes: OutcomeBoard,
        ledger: DeliveryLedger,
        lock_factory: LockFactory,
    ) -> None:
        self.cfg = cfg
        self._r = client
        self._executor = executor
        self._channels = channels
        self._inbox = inbox
        self._signals = signals
        self._outcomes = outcomes
        self._ledger = ledger
        self._lock_factory = lock_factory
        self._keys = Keys(cfg.redis.prefix)
        self.tasks: dict[str, asyncio.Task[None]] = {}  # the worker serving each session here
        self.active: dict[str, SessionRun] = {}
        self._rekick: set[str] = set()  # kicked while its worker was already running
        self._claiming: set[str] = set()  # sessions whose lock a submitter holds (claim_lock) until its claim is back
        self._early_stops: dict[str, float] = {}  # stops that came before the session's run was registered
        self._slots = Slots(cfg.gateway.max_concurrent_runs)
        self._closing = False
        self._sweeper: asyncio.Task[None] | None = None
        self._kicks = 0  # kick() calls so far: a sweep goes quiet only if none came in meanwhile
        self._quiet = False  # the last sweep found nothing and nothing was kicked since
        self._kicked = asyncio.Event()  # ends a quiet sweeper's long wait

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="gateway-sweeper")

    async def shutdown(self, grace_s: float) -> None:
        """Stop taking work, let runs finish for ``grace_s``, then cancel the rest."""
        self._closing = True
        await stop_task(self._sweeper)
        workers = list(self.tasks.values())
        if workers:
            _, pending = await asyncio.wait(workers, timeout=grace_s)
            for run in self.active.values():
                run.shutdown()
            if pending:
                await asyncio.wait(pending, timeout=10)

    def busy(self) -> bool:
        return bool(self.tasks)

    def cancel(self, session_key: str, reason: str) -> None:
        run = self.active.get(session_key)
        if run is not None:
            run.cancel(reason)

    def stop(self, session_key: str, at: float) -> None:
        """A /stop at ``at`` (Redis' clock): cancel the session's run here if it started by
        then. A run whose batch is being claimed, or whose worker is starting, is not
        registered yet: the stop is kept for it and applied when it registers (it may have
        read the stop key before the stop was written, with its claim)."""
        run = self.active.get(session_key)
        if run is not None:
            run.cancel_if_started_before(at, "stopped")
        elif session_key in self.tasks or session_key in self._claiming:
            self._early_stops[session_key] = max(at, self._early_stops.get(session_key, at))

    def fold(self, session_key: str) -> bool:
        """Fold a just-queued message into the session's run here, if it has shown nothing yet."""
        run = self.active.get(session_key)
        return run is not None and run.fold()

    # ---- serving a session -------------------------------------------------------------

    def claim_lock(self, session_key: str) -> SessionLock | None:
        """The session's lock, for a submitter to take together with its message
        (``Inbox.enqueue_and_claim``) when this replica would serve the session at once: no
        worker of the session here nor a claim of it under way, and a run slot taken for it
        now, which no worker kicked meanwhile can take. None otherwise: the message is
        queued, and kicked or folded as usual, so a burst beyond the slots takes no lock it
        would hold waiting (another replica may be free to serve it). The slot is the
        claim's worker's, or given back by :meth:`claim_returned`."""
        if (
            self._closing or session_key in self.tasks or session_key in self._claiming
            # Workers kicked but not yet waiting for a slot count too: they are served first.
            or len(self.tasks) + len(self._claiming) >= self.cfg.gateway.max_concurrent_runs
            or not self._slots.take_now()
        ):
            return None
        self._claiming.add(session_key)
        return self._new_lock(session_key)

    def _new_lock(self, session_key: str) -> SessionLock:
        """The session's lock, whose loss cancels the session's run here."""
        return self._lock_factory(session_key, lambda: self.cancel(session_key, "lock_lost"))

    def read_ahead(self, session_key: str) -> ReadAhead:
        """A run's first reads (the session's context, its stop key), to queue after the
        claim that takes the session's lock and batch (``Inbox.enqueue_and_claim``): the
        run then starts without a round trip of its own. Holding the lock, nobody else
        changes the history in between; a stop written after the read is caught by
        :meth:`stop`. Plain reads, unused when the lock is held elsewhere: a Lua step
        guarding them on the lock cost the server more on every lone message."""
        sessions, stop_key = self._executor.deps.sessions, self._signals.key(session_key)

        def queue(pipe: Pipeline) -> Callable[[list[Any]], RunStart]:
            pipe.get(stop_key)  # first, so the context's reader takes all the replies after it
            context = sessions.queue_context(pipe, session_key)
            return lambda replies: RunStart(context(replies[1:]), replies[0], time.monotonic())
        return queue

    def claim_returned(self, session_key: str, lock: SessionLock, claim: Claim | None) -> None:
        """A submitter's try with a :meth:`claim_lock` lock is over: a worker starts on its
        claim, if it got one (and then counts among the tasks)."""
        self._claiming.discard(session_key)
        if claim is not None:
            self.kick(session_key, (lock, claim))  # its worker holds the slot taken for it
            return
        self._slots.give()
        if session_key not in self.tasks:
            self._early_stops.pop(session_key, None)

    def kick(self, session_key: str, claimed: tuple[SessionLock, Claim] | None = None) -> None:
        """Serve ``session_key`` unless this replica already does (or is closing). With
        ``claimed`` (a lock from :meth:`claim_lock`, taken, and its batch) a worker starts
        on it in any case: holding the lock, no other can be serving the session."""
        self._kicks += 1
        if self._quiet:
            self._quiet = False
            self._kicked.set()
        if claimed is None:
            if self._closing:
                return
            if session_key in self.tasks:
                # Its worker may be past its last look at the inbox: it serves the session again.
                self._rekick.add(session_key)
                return
        task = asyncio.create_task(self._serve(session_key, claimed), name=f"session:{session_key}")
        self.tasks[session_key] = task
        task.add_done_callback(lambda done: self._forget(session_key, done))

    def _forget(self, session_key: str, task: asyncio.Task[Any] | None) -> None:
        # A worker may have started its successor before it ended: only forget itself.
        if self.tasks.get(session_key) is task:
            del self.tasks[session_key]
            if session_key not in self._claiming:
                self._early_stops.pop(session_key, None)

    async def _serve(self, session_key: str, claimed: tuple[SessionLock, Claim] | None = None) -> None:
        held = False
        waiting = False
        slot = claimed is not None  # an intake's claim comes with the slot taken for it
        try:
            if not slot:
                await self._slots.take()
                slot = True
            if claimed is not None:  # taken at intake; when closing, _drain leaves it for a resume
                lock, claim = claimed
            else:
                if self._closing:  # stopping while this worker waited for a slot: take nothing
                    return
                lock = self._new_lock(session_key)
                found = await self._inbox.lock_and_claim(session_key, lock)
                if found is None:
                    return
                claim = found
            held = True
            try:
                await self._drain(session_key, lock, claim)
            finally:
                # Released together with a look at the inbox (by the last finish, or
                # here): a message that arrived meanwhile (its submitter saw the lock
                # held) is served again below. Kicks are forgotten just before a look
                # at the inbox, never after it (as in ``_finish``).
                if lock.token is not None:
                    self._rekick.discard(session_key)
                    waiting = True
                    with contextlib.suppress(Exception):
                        waiting = await asyncio.shield(lock.release_and_check())
        except RedisError as exc:
            log.warning("worker.store_error", session_key=session_key, error=str(exc))
            return
        finally:
            if slot:
                self._slots.give()
            self._forget(session_key, asyncio.current_task())
        if session_key in self.tasks:  # a worker that started on an intake's claim meanwhile
            return
        rekick = session_key in self._rekick
        self._rekick.discard(session_key)
        if held and not self._closing and (waiting or rekick):
            self.kick(session_key)

    async def _drain(self, session_key: str, lock: SessionLock, claim: Claim) -> None:
        """Run the session's batches while holding its lock.

        A batch starts at once; messages that arrive before it shows anything are folded
        into it (the run restarts with them). Stops when the lock is no longer held (a
        run only notices a lost lock while it is registered as active; between runs this
        check does it), and after a batch when other sessions wait for a run slot, so one
        busy chat cannot keep a slot forever: the worker then goes to the back of the queue.
        ``claim`` is the first batch, taken with the lock; the last finish releases it.
        """
        while not self._closing:
            if not lock.is_held:
                log.warning("worker.lock_lost_between_runs", session_key=session_key)
                return
            batch, started_at = claim.batch, claim.server_time
            if claim.resumed:
                batch = await self._retry_guard(session_key, batch)
                started_at = await server_time(self._r)
            if not batch:
                await self._finish(session_key, lock)
                return
            start = None if claim.resumed else claim.ahead  # an intake's claim reads the run's start too
            outcome = await self._run(session_key, batch, lock, started_at, resumed=claim.resumed, start=start)
            while outcome == FOLD:
                batch = batch + await self._inbox.take(session_key)
                log.info("run.folded", session_key=session_key, run_id=batch[0].run_id, messages=len(batch))
                outcome = await self._run(session_key, batch, lock, await server_time(self._r), resumed=False)
            if outcome is None:
                return  # left for a retry (shutdown, lock lost, store error)
            if not await self._finish(session_key, lock, batch[0].run_id, outcome.also):
                return
            if self._slots.contended:
                return  # others are waiting for a slot; the re-kick in _serve requeues us
            claim = await self._inbox.claim(session_key)

    async def _finish(
        self, session_key: str, lock: SessionLock, run_id: str | None = None, also: RideAlong | None = None
    ) -> bool:
        """:meth:`Inbox.finish` with the lock. A kick from before it is seen by its look at the
        inbox and forgotten; one that lands while its round trip is in flight (the submitter
        saw the lock free) stays in ``_rekick``, and ``_serve`` serves the session again."""
        self._rekick.discard(session_key)
        return await self._inbox.finish(session_key, run_id, lock=lock, also=also)

    async def _retry_guard(self, session_key: str, batch: list[RunRequest]) -> list[RunRequest]:
        """Resume a batch a previous holder left; give up on it after MAX_ATTEMPTS."""
        key = self._keys.resumes(batch[0].run_id)
        pipe = self._r.pipeline(transaction=True)
        pipe.sadd(key, uuid.uuid4().hex)  # by id: sent again after a lost reply, it counts once
        pipe.scard(key)
        pipe.expire(key, 86400)
        _, attempts, _ = await pipe.execute()
        log.info("run.resuming", session_key=session_key, run_id=batch[0].run_id, attempt=attempts)
        if attempts <= MAX_ATTEMPTS:
            return batch
        log.error("run.abandoned", session_key=session_key, run_id=batch[0].run_id, attempts=attempts)
        channel = self._channels.get(batch[-1].channel)
        if channel is not None:
            await notify(channel, Target.of(batch[-1]), self._ledger, batch[0].run_id, "abandoned",
                         "Sorry — I could not process your message after several attempts. Please send it again.")
        await self._inbox.finish(session_key, batch[0].run_id)
        return await self._inbox.take(session_key)

    def _fold_window(self, batch: list[RunRequest]) -> float:
        """How long after its start a run takes in more messages; an album arrives as one
        message per file, and all of them must make one run."""
        window = self.cfg.queue.debounce_ms / 1000
        return max(window, MEDIA_GROUP_WAIT_S) if any(r.meta.get("media_group") for r in batch) else window

    async def _run(
        self, session_key: str, batch: list[RunRequest], lock: SessionLock, started_at: float, *, resumed: bool,
        start: RunStart | None = None,
    ) -> RunOutcome | Literal["fold"] | None:
        """One run of ``batch``: its outcome, None when it is left for a retry, or FOLD when
        it was cancelled to start again with the messages that followed it."""
        task = asyncio.current_task()
        assert task is not None
        foldable = self.cfg.queue.mode != "interrupt" and all(r.kind == "chat" for r in batch)
        run = SessionRun(
            task, started_at=started_at, run_id=batch[0].run_id, session_key=session_key,
            inbox=self._inbox, signals=self._signals, steer_mode=self.cfg.queue.mode == "steer",
            fold_window_s=self._fold_window(batch) if foldable else 0.0, resumed=resumed, start=start,
        )
        self.active[session_key] = run
        if (stopped_at := self._early_stops.pop(session_key, None)) is not None:
            run.cancel_if_started_before(stopped_at, "stopped")
        if not lock.is_held:  # lost while we were registering: on_lost found nothing to cancel
            self.active.pop(session_key, None)
            return None
        timeout = float(batch[0].meta.get("timeout_s") or self.cfg.gateway.run_timeout_s)
        timer = asyncio.get_running_loop().call_later(timeout, run.cancel, "timeout")
        outcome: RunOutcome | None
        try:
            outcome = await self._executor.execute(batch, run)
        except asyncio.CancelledError:
            if run.reason is None:
                raise  # not ours: the caller is cancelling the worker itself
            run.acknowledge()
            uncancel_current()
            outcome = RunOutcome(run.run_id, "cancelled", "none", run.reason)
        except RedisError as exc:
            log.error("run.store_error", session_key=session_key, run_id=run.run_id, error=str(exc))
            outcome = None
        finally:
            timer.cancel()
            self.active.pop(session_key, None)
            run.close()
        if run.reason == FOLD:
            return FOLD
        if outcome is not None and run.reason in RETRY_REASONS:
            outcome = None
        if outcome is not None:
            with contextlib.suppress(RedisError):
                await self._outcomes.publish([r.run_id for r in batch if r.kind != "chat"], outcome)
        return outcome

    # ---- sweeping ----------------------------------------------------------------------

    async def _sweep(self) -> None:
        while True:
            if self._quiet:
                self._kicked.clear()
                with contextlib.suppress(TimeoutError):  # asyncio.timeout: never swallows a cancel, unlike wait_for
                    async with asyncio.timeout(QUIET_SWEEP_INTERVAL_S):
                        await self._kicked.wait()
            else:
                await asyncio.sleep(SWEEP_INTERVAL_S)
            kicks = self._kicks
            try:
                sessions, depth = await self._inbox.pending_with_depth(older_than_s=SWEEP_INTERVAL_S)
                metrics.QUEUE_DEPTH.set(depth)
            except RedisError as exc:
                log.warning("sweeper.store_error", error=str(exc))
                continue
            self._quiet = depth == 0 and not self.tasks and kicks == self._kicks
            for session_key in sessions:
                if session_key not in self.active:
                    self.kick(session_key)
