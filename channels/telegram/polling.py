"""getUpdates long polling by exactly one replica per bot token.

Telegram allows one getUpdates consumer per token (a second one gets 409 Conflict), so
replicas elect a leader through a lease in the shared store: ``set_nx`` to take it,
``extend_if_owner`` to keep it. Followers retry taking it, so when the leader stops (or
dies and its lease expires) another one takes over within the lease TTL.

The offset advances only after an update was handed over (submitted), so a crash never
loses an update; a repeat after a restart is caught by the gateway's dedupe. Telegram
confirms the handled updates with the next getUpdates, so a new leader is never served
them again; the offset is also kept in the store, written with each lease renewal and
on stop rather than per batch (a store write per message otherwise), for a leader that
took over from one which died before that next call. A poll loop that makes no progress
for ``stall_timeout_s`` is cancelled and restarted.

Polling is bounded whatever the Bot API does: errors back off exponentially, and an
empty answer that comes back long before ``timeout`` (a proxy or server ignoring long
polling) backs off too, from ``MIN_EMPTY_WAIT_S`` up to ``MAX_EMPTY_WAIT_S``, so an
idle bot never issues more than a few getUpdates a second. A run of failures is
logged once when it starts and once when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence

import structlog
from telegram import Bot, Update
from telegram.error import Conflict, Forbidden, InvalidToken, NetworkError, RetryAfter, TelegramError

from agent.tasks import raise_if_cancelled
from channels.base import KeyValue
from channels.telegram.redact import scrub
from channels.telegram.send import retry_after_seconds

log = structlog.get_logger(__name__)

UpdateHandler = Callable[[Update], Awaitable[None]]
OFFSET_TTL_S = 24 * 3600.0  # Telegram keeps undelivered updates for 24 hours
STOP_TIMEOUT_S = 5.0
MIN_EMPTY_WAIT_S = 0.5
MAX_EMPTY_WAIT_S = 5.0


class PollingIntake:
    """Leader election plus the getUpdates loop for one bot."""

    def __init__(
        self,
        bot: Bot,
        kv: KeyValue,
        handle: UpdateHandler,
        *,
        bot_id: str,
        replica_id: str,
        allowed_updates: Sequence[str] = ("message", "callback_query"),
        lease_ttl_s: float = 30.0,
        renew_every_s: float = 10.0,
        stall_timeout_s: float = 120.0,
        poll_timeout_s: int = 25,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
    ) -> None:
        if renew_every_s >= lease_ttl_s:
            raise ValueError("the lease must be renewed more often than it expires")
        self.bot = bot
        self.kv = kv
        self.handle = handle
        self.replica_id = replica_id
        self.lease_key = f"telegram:poller:{bot_id}"
        self.offset_key = f"telegram:offset:{bot_id}"
        self.allowed_updates = list(allowed_updates)
        self.lease_ttl_s = lease_ttl_s
        self.renew_every_s = renew_every_s
        self.stall_timeout_s = stall_timeout_s
        self.poll_timeout_s = poll_timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.is_leader = False
        self.restarts = 0  # poll loops restarted after a stall
        self.conflicts = 0  # 409 answers seen
        self._failures = 0  # consecutive failed getUpdates calls
        self._early_empties = 0  # consecutive empty answers that ignored the long-poll timeout
        self.backoffs = 0  # waits inserted by the polling bound (errors and early answers)
        self._offset: int | None = None
        self._saved_offset: int | None = None  # the offset the store holds, as far as we know
        self._last_progress = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    @property
    def healthy(self) -> bool:
        """False while getUpdates keeps failing (a follower is healthy while it waits)."""
        return self._task is not None and not self._task.done() and self._failures < 3

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tg-poller")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)
            if not done:
                log.warning("telegram.poller_stop_timeout", timeout_s=STOP_TIMEOUT_S)
            elif not task.cancelled() and task.exception() is not None:
                log.error("telegram.poller_failed", error=scrub(repr(task.exception())))
        self.is_leader = False
        await self._save_offset()
        try:  # release the lease so a follower takes over now, not when it expires
            if await self.kv.get(self.lease_key) == self.replica_id:
                await self.kv.delete(self.lease_key)
                log.info("telegram.poller_released", replica=self.replica_id)
        except Exception as exc:
            log.warning("telegram.poller_release_failed", error=scrub(str(exc)))

    # -- leadership -------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            # Library calls (redis, httpx) may swallow a cancellation: check each round.
            raise_if_cancelled()
            acquired = await self._acquire()
            raise_if_cancelled()
            if acquired:
                self.is_leader = True
                log.info("telegram.poller_leader", replica=self.replica_id)
                try:
                    await self._lead()
                    log.warning("telegram.poller_lease_lost", replica=self.replica_id)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # keep the replica in the election whatever happened
                    log.error("telegram.poller_crashed", error=scrub(repr(exc)))
                finally:
                    self.is_leader = False
            await asyncio.sleep(self.renew_every_s)

    async def _acquire(self) -> bool:
        try:
            if await self.kv.set_nx(self.lease_key, self.replica_id, self.lease_ttl_s):
                return True
            return await self.kv.get(self.lease_key) == self.replica_id
        except Exception as exc:
            log.warning("telegram.poller_lease_error", error=scrub(str(exc)))
            return False

    async def _keep_lease(self) -> None:
        """Returns when the lease is lost (taken over, or not renewable within its TTL)."""
        last_ok = time.monotonic()
        while True:
            await asyncio.sleep(self.renew_every_s)
            try:
                extended = await self.kv.extend_if_owner(self.lease_key, self.replica_id, self.lease_ttl_s)
                raise_if_cancelled()
                if not extended:
                    return
                last_ok = time.monotonic()
                await self._save_offset()
            except Exception as exc:
                log.warning("telegram.poller_lease_error", error=scrub(str(exc)))
                if time.monotonic() - last_ok >= self.lease_ttl_s - self.renew_every_s:
                    return

    async def _lead(self) -> None:
        keeper = asyncio.create_task(self._keep_lease(), name="tg-lease")
        poller: asyncio.Task[None] | None = None
        try:
            self._offset = await self._stored_offset()
            while not keeper.done():
                raise_if_cancelled()
                if poller is None or poller.done():
                    if poller is not None and not poller.cancelled() and poller.exception() is not None:
                        log.error("telegram.poller_crashed", error=scrub(repr(poller.exception())))
                        await asyncio.sleep(self.backoff_s)
                    self._last_progress = time.monotonic()
                    poller = asyncio.create_task(self._poll_loop(), name="tg-getupdates")
                check = min(1.0, self.stall_timeout_s / 4)
                await asyncio.wait({keeper, poller}, timeout=check, return_when=asyncio.FIRST_COMPLETED)
                if not keeper.done() and time.monotonic() - self._last_progress > self.stall_timeout_s:
                    self.restarts += 1
                    log.warning("telegram.poller_stalled", stalled_s=round(time.monotonic() - self._last_progress, 1))
                    await _cancel(poller)
                    poller = None
        finally:
            await _cancel(poller)
            await _cancel(keeper)

    # -- polling -------------------------------------------------------------------------

    async def _stored_offset(self) -> int | None:
        try:
            raw = await self.kv.get(self.offset_key)
        except Exception as exc:
            log.warning("telegram.offset_read_failed", error=scrub(str(exc)))
            return self._offset
        if raw is not None and raw.isdigit():
            self._saved_offset = int(raw)
            return max(int(raw), self._offset or 0)
        return self._offset

    async def _save_offset(self) -> None:
        """Keep the offset in the store when it moved since the last write; best effort."""
        offset = self._offset
        if offset is None or offset == self._saved_offset:
            return
        try:
            await self.kv.set(self.offset_key, str(offset), OFFSET_TTL_S)
        except Exception as exc:
            log.warning("telegram.offset_write_failed", error=scrub(str(exc)))
            return
        self._saved_offset = offset

    async def _poll_loop(self) -> None:
        webhook_cleared = False
        while True:
            raise_if_cancelled()
            try:
                if not webhook_cleared:
                    await self.bot.delete_webhook(drop_pending_updates=False)
                    webhook_cleared = True
                asked_at = time.monotonic()
                updates = await self.bot.get_updates(
                    offset=self._offset, timeout=self.poll_timeout_s, allowed_updates=self.allowed_updates
                )
                raise_if_cancelled()
            except Conflict as exc:
                self.conflicts += 1
                webhook_cleared = "webhook" not in str(exc).lower()
                await self._failed("telegram.poll_conflict", exc)
                continue
            except RetryAfter as exc:
                await self._failed("telegram.poll_rate_limited", exc, retry_after_seconds(exc))
                continue
            except (InvalidToken, Forbidden) as exc:
                await self._failed("telegram.poll_unauthorized", exc, self.max_backoff_s)
                continue
            except (NetworkError, TelegramError) as exc:
                await self._failed("telegram.poll_error", exc)
                continue
            except (AttributeError, TypeError, KeyError, ValueError) as exc:  # an answer the library cannot read
                await self._failed("telegram.poll_malformed_answer", exc)
                continue
            if self._failures:
                log.info("telegram.poll_recovered", failures=self._failures)
            self._failures = 0
            self._last_progress = time.monotonic()
            if not await self._dispatch(updates):
                await asyncio.sleep(self.backoff_s)
            await self._bound_empty(bool(updates), time.monotonic() - asked_at)

    async def _bound_empty(self, got_updates: bool, took_s: float) -> None:
        """Wait before the next poll when an empty answer ignored the long-poll timeout."""
        if got_updates or took_s >= min(1.0, self.poll_timeout_s / 2):
            if self._early_empties:
                log.info("telegram.poll_long_polling_back", early_answers=self._early_empties)
            self._early_empties = 0
            return
        self._early_empties += 1
        delay = min(MAX_EMPTY_WAIT_S, max(MIN_EMPTY_WAIT_S, self.backoff_s) * 2 ** min(self._early_empties - 1, 8))
        if self._early_empties == 1:
            log.warning("telegram.poll_answered_early", took_s=round(took_s, 3), timeout_s=self.poll_timeout_s,
                        hint="the Bot API (or a proxy) ignores the getUpdates timeout; polling backs off")
        self.backoffs += 1
        await asyncio.sleep(delay)

    async def _dispatch(self, updates: Sequence[Update]) -> bool:
        """Hand updates over in order; False (offset kept) if handing one over failed."""
        for update in updates:
            try:
                await self.handle(update)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error("telegram.update_failed", update_id=update.update_id, error=scrub(repr(exc)))
                return False
            self._offset = update.update_id + 1
            self._last_progress = time.monotonic()
        return True

    async def _failed(self, event: str, exc: BaseException, wait: float | None = None) -> None:
        raise_if_cancelled()
        self._failures += 1
        delay = wait if wait is not None else min(self.max_backoff_s, self.backoff_s * 2 ** min(self._failures - 1, 16))
        error = scrub(str(exc) or type(exc).__name__)
        if self._failures == 1:
            log.warning(event, error=error, retry_in_s=round(delay, 2))
        else:
            log.debug(event, error=error, retry_in_s=round(delay, 2), failures=self._failures)
        self.backoffs += 1
        await asyncio.sleep(delay)


async def _cancel(task: asyncio.Task[None] | None) -> None:
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
