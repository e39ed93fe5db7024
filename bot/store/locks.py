"""Redis leases: one holder at a time, kept alive by a watchdog (DESIGN.md §5 Gateway).

A lease is a key holding its owner's unique token with a TTL. Taking it, renewing it and
releasing it are compare-and-set Lua scripts (``owned.py``), so nobody ever extends or deletes a lease
held by someone else. While held, a watchdog renews it every TTL/3. When renewal finds
the key gone or owned by another token, or Redis has not confirmed a renewal for a whole
TTL (the key may have expired on the server by now), the lease is lost: ``on_lost`` runs
so its holder stops (the gateway cancels the run). :class:`SessionLock` is the lease on a
session key; plain :class:`Lease` serves leader election (e.g. Telegram polling).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypedDict, Unpack

import redis.asyncio as aioredis
import structlog
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from agent.tasks import stop_task
from bot.store.errors import LockTimeout
from bot.store.keys import Keys
from bot.store.owned import OwnedKeys, shared_script, ttl_ms

log = structlog.get_logger(__name__)

OnLost = Callable[[], Awaitable[None] | None]

DEFAULT_TTL_S = 30.0
MAX_POLL_S = 0.5
MAX_RELEASE_WAIT_S = 5.0

# Release a session lock and say, in the same step, whether work is waiting for the session.
RELEASE_SESSION = """
local released = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  released = redis.call('DEL', KEYS[1])
end
return {released, redis.call('EXISTS', KEYS[2], KEYS[3])}
"""


class Lease:
    """An exclusive, self-renewing lease on one Redis key. Usable as ``async with``."""

    def __init__(
        self,
        client: aioredis.Redis,
        key: str,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        owner: str | None = None,
        on_lost: OnLost | None = None,
        auto_renew: bool = True,
        acquire_timeout_s: float | None = None,
    ) -> None:
        """``on_lost`` (sync or async) runs in the watchdog task; keep it short, e.g. cancel
        the run's task rather than await its end. ``acquire_timeout_s`` bounds ``async with``."""
        if ttl_s < 0.1:
            raise ValueError(f"a lease TTL must be at least 0.1 s, got {ttl_s!r}")
        self._client = client
        self.key = key
        self.ttl_s = float(ttl_s)
        ttl_ms(ttl_s)  # rejects a TTL Redis cannot hold, here rather than at the first acquire
        self._owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self._on_lost = on_lost
        self._auto_renew = auto_renew
        self._acquire_timeout_s = acquire_timeout_s
        self._owned = OwnedKeys(client)
        self._token: str | None = None
        self._held = False
        self._valid_until = 0.0
        self._watchdog: asyncio.Task[None] | None = None
        self._renewal: asyncio.TimerHandle | None = None  # starts the watchdog a third of the TTL in
        self._lost = asyncio.Event()
        self._step_done: asyncio.Event | None = None  # set by ``releasing`` while its step runs

    @property
    def token(self) -> str | None:
        """The value stored in the key while held (``<owner>:<random>``)."""
        return self._token

    @property
    def is_held(self) -> bool:
        """Held and, as far as this process can know, not yet expired on the server."""
        return self._held and time.monotonic() < self._valid_until

    async def wait_lost(self) -> None:
        """Return once the lease has been lost (not on a normal release)."""
        await self._lost.wait()

    async def holder(self) -> str | None:
        """The token of whoever holds the key now, if anyone."""
        value = await self._client.get(self.key)
        return None if value is None else str(value)

    async def acquire(self, wait: bool = True, timeout_s: float | None = None) -> bool:
        """Take the lease; with ``wait``, poll until free or ``timeout_s`` passes (None: no limit)."""
        if self._held:
            raise RuntimeError(f"lease {self.key} is already held by this object")
        token = self._new_token()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delay = min(0.05, self.ttl_s / 10)
        while True:
            sent = time.monotonic()
            if await self._owned.acquire(self.key, token, self.ttl_s):
                self._hold(token, sent)
                return True
            if not wait:
                return False
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            pause = delay if deadline is None else min(delay, deadline - now)
            await asyncio.sleep(pause)
            delay = min(delay * 2, MAX_POLL_S)

    async def acquire_then(self, queue: Callable[[Pipeline, str], None]) -> list[Any] | None:
        """Take the lease without waiting and, in the same round trip, run what ``queue``
        adds to a pipeline for the new token: the replies of those commands, or None when
        the lease is held elsewhere. They run either way, so each must check that the key
        holds the token (a script reading ``self.key``) before it changes anything."""
        taken, replies = await self.acquire_with(queue)
        return replies if taken else None

    async def acquire_with(self, queue: Callable[[Pipeline, str], None]) -> tuple[bool, list[Any]]:
        """:meth:`acquire_then`, with the replies also when the lease is held elsewhere
        (for commands queued with it that do not depend on it)."""
        if self._held:
            raise RuntimeError(f"lease {self.key} is already held by this object")
        token = self._new_token()
        pipe = self._client.pipeline(transaction=False)
        self._owned.queue_acquire(pipe, self.key, token, self.ttl_s)
        queue(pipe, token)
        sent = time.monotonic()
        taken, *replies = await pipe.execute()
        if taken:
            self._hold(token, sent)
        return bool(taken), replies

    def _new_token(self) -> str:
        return f"{self._owner}:{uuid.uuid4().hex}"

    def _hold(self, token: str, sent: float) -> None:
        self._token = token
        self._held = True
        self._valid_until = sent + self.ttl_s
        self._lost.clear()
        if self._auto_renew:
            # A timer, not a task: most holders release before the first renewal.
            self._renewal = asyncio.get_running_loop().call_later(self.ttl_s / 3, self._start_watch, token)

    @contextlib.asynccontextmanager
    async def releasing(self) -> AsyncIterator[None]:
        """Around a step of the holder's that may delete the key (an owner-checked script
        with other work, followed by :meth:`forget`). A renewal that finds the key gone
        while the step runs waits for it: the step's own delete is not a loss, and its
        ``forget`` ends the watchdog quietly; a key gone otherwise is a loss after the step."""
        done = asyncio.Event()
        self._step_done = done
        try:
            yield
        finally:
            if self._step_done is done:
                self._step_done = None
            done.set()

    def forget(self) -> None:
        """A script of the holder's deleted the key (owner-checked, with other work in one
        step): stop renewing, as :meth:`release` would, without a round trip of its own."""
        watchdog, _ = self._let_go()
        if watchdog is not None:
            watchdog.cancel()

    def _let_go(self) -> tuple[asyncio.Task[None] | None, str | None]:
        """Stop the renewal timer and mark the lease free; the watchdog and token it had."""
        if self._renewal is not None:
            self._renewal.cancel()
            self._renewal = None
        watchdog, self._watchdog = self._watchdog, None
        self._held = False
        token, self._token = self._token, None
        return watchdog, token

    async def release(self) -> bool:
        """Stop renewing and delete the key if still ours. True when it was deleted.

        A Redis error here is logged, not raised: the key then expires by its TTL. Safe to
        call from ``on_lost`` (the watchdog is not awaited then) and more than once.
        """
        reply = await self._release_with(lambda token: self._owned.delete_if_owner(self.key, token))
        return bool(reply)

    async def _release_with(self, release: Callable[[str], Awaitable[Any]]) -> Any:
        """Stop the watchdog and ``release`` with our token (an owner-checked delete);
        its reply, or None when there was nothing to release or it failed."""
        watchdog, token = self._let_go()
        await stop_task(watchdog)
        if token is None:
            return None
        try:
            # Bounded: once the TTL has passed the key is gone anyway.
            async with asyncio.timeout(min(self.ttl_s, MAX_RELEASE_WAIT_S)):
                return await release(token)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("store.lease.release_failed", key=self.key, error=type(exc).__name__)
            return None

    async def __aenter__(self) -> Lease:
        if not await self.acquire(wait=True, timeout_s=self._acquire_timeout_s):
            raise LockTimeout(f"could not take {self.key} within {self._acquire_timeout_s} s")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    def _start_watch(self, token: str) -> None:
        self._renewal = None
        if self._held and self._token == token:
            self._watchdog = asyncio.create_task(self._watch(token), name=f"lease-watchdog:{self.key}")

    async def _watch(self, token: str) -> None:
        """Renew every third of the TTL, the first time at once (the timer waited that long)."""
        interval = self.ttl_s / 3
        retry = min(interval, 0.5)
        pause = 0.0
        while True:
            await asyncio.sleep(pause)
            sent = time.monotonic()
            remaining = self._valid_until - sent
            if remaining <= 0:
                await self._declare_lost("redis unreachable for longer than the ttl")
                return
            try:
                async with asyncio.timeout(remaining):
                    renewed = await self._owned.extend_if_owner(self.key, token, self.ttl_s)
            except (RedisError, OSError, TimeoutError) as exc:
                log.warning("store.lease.renew_failed", key=self.key, error=type(exc).__name__)
                if time.monotonic() >= self._valid_until:
                    await self._declare_lost("redis unreachable for longer than the ttl")
                    return
                pause = min(retry, max(0.0, self._valid_until - time.monotonic()))
                continue
            if not renewed:
                if self._step_done is not None:
                    # The step's forget() cancels this wait if the step deleted the key.
                    await self._step_done.wait()
                await self._declare_lost("taken over or expired")
                return
            self._valid_until = sent + self.ttl_s
            pause = interval

    async def _declare_lost(self, reason: str) -> None:
        self._held = False
        self._watchdog = None
        self._lost.set()
        log.warning("store.lease.lost", key=self.key, reason=reason)
        if self._on_lost is None:
            return
        try:
            result = self._on_lost()
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("store.lease.on_lost_failed", key=self.key)


class LeaseOptions(TypedDict, total=False):
    """:class:`Lease`'s keyword arguments, for leases whose key is derived (``SessionLock``)."""

    ttl_s: float
    owner: str | None
    on_lost: OnLost | None
    auto_renew: bool
    acquire_timeout_s: float | None


class SessionLock(Lease):
    """The one-active-run-per-session lock, ``<prefix>:lock:<session_key>``."""

    def __init__(self, client: aioredis.Redis, keys: Keys, session_key: str, **options: Unpack[LeaseOptions]) -> None:
        super().__init__(client, keys.lock(session_key), **options)
        self.session_key = session_key
        self._work_keys = [keys.inbox(session_key), keys.running(session_key)]
        self._release_session = shared_script(client, RELEASE_SESSION)

    async def release_and_check(self) -> bool:
        """Release (as :meth:`release`) and say whether the session has work waiting at
        that moment, queued or left running; True also when that could not be read."""
        reply = await self._release_with(
            lambda token: self._release_session(keys=[self.key, *self._work_keys], args=[token])
        )
        return reply is None or bool(reply[1])

    async def __aenter__(self) -> SessionLock:
        await super().__aenter__()
        return self
