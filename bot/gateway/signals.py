"""Signals between replicas: one pub/sub listener per process, and what travels on it.

``Broadcast`` holds the process's one pub/sub connection and fans messages out to
handlers by channel (the gateway's stops and outcomes, approvals, the scheduler's
change feed). Pub/sub is best effort (a reconnect can miss messages), so every user of
it also keeps the state in a key that is polled; pub/sub only makes things immediate.

``CancelSignals`` is ``/stop`` across replicas: a cancel key with a TTL plus a
broadcast. The key holds the Redis server time of the stop; a run that started at or
before it is cancelled. The broadcast makes that immediate; the key makes a missed
message harmless, because every run also checks it before each LLM call.

``OutcomeBoard`` holds the outcomes of scheduled runs, readable from any replica: the
scheduler claims a fire on one replica but the run may execute on another (the session
lock decides), so outcomes are written to Redis and broadcast; a waiter listens and
polls once a second as a fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
import structlog

from agent.tasks import stop_task
from bot.gateway.run_control import RunOutcome
from bot.store.keys import Keys

log = structlog.get_logger(__name__)

Handler = Callable[[dict[str, Any]], Awaitable[None]]
# How long one wait for a message lasts. Messages are handled as they arrive whatever
# this is; each return without one only re-checks the connection's health (a PING once
# every health-check interval), so an idle daemon need not wake every second for it.
LISTEN_WAKE_S = 10.0
ReconnectHandler = Callable[[], Awaitable[None]]


class Broadcast:
    def __init__(self, client: aioredis.Redis) -> None:
        self._r = client
        self._handlers: dict[str, Handler] = {}
        self._reconnect_handlers: list[ReconnectHandler] = []
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    def on(self, channel: str, handler: Handler) -> None:
        if self._task is not None:
            raise RuntimeError("subscribe before start()")
        self._handlers[channel] = handler

    def on_reconnect(self, handler: ReconnectHandler) -> None:
        """Call ``handler`` after a lost connection is subscribed again (messages sent
        meanwhile are lost, so its owner resyncs from the store)."""
        if self._task is not None:
            raise RuntimeError("subscribe before start()")
        self._reconnect_handlers.append(handler)

    async def publish(self, channel: str, data: dict[str, Any]) -> None:
        await self._r.publish(channel, json.dumps(data))

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="broadcast")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._subscribed.wait(), timeout=5.0)

    async def _run(self) -> None:
        reconnecting = False
        while True:
            pubsub = self._r.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(*self._handlers)
                self._subscribed.set()
                if reconnecting:
                    reconnecting = False
                    await self._reconnected()
                while True:
                    msg = await pubsub.get_message(timeout=LISTEN_WAKE_S)
                    if msg is None or msg.get("type") != "message":
                        continue
                    handler = self._handlers.get(str(msg["channel"]))
                    if handler is None:
                        continue
                    try:
                        await handler(json.loads(msg["data"]))
                    except Exception:
                        log.exception("broadcast.handler_failed", channel=str(msg["channel"]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("broadcast.reconnecting", error=str(exc))
                reconnecting = True
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def _reconnected(self) -> None:
        for handler in self._reconnect_handlers:
            try:
                await handler()
            except Exception:
                log.exception("broadcast.reconnect_handler_failed")

    async def close(self) -> None:
        await stop_task(self._task)
        self._task = None


CANCEL_TTL_S = 600


async def server_time(client: aioredis.Redis) -> float:
    """Redis' clock, so replicas with skewed clocks agree on before/after."""
    sec, usec = await client.time()
    return float(sec) + float(usec) / 1_000_000


class CancelSignals:
    def __init__(self, client: aioredis.Redis, prefix: str, broadcast: Broadcast) -> None:
        self._r = client
        self._keys = Keys(prefix)
        self._broadcast = broadcast

    @property
    def channel(self) -> str:
        return self._keys.cancel_channel()

    def key(self, session_key: str) -> str:
        """Where the session's last stop time is kept (read it with :func:`stopped_since_value`)."""
        return self._keys.cancel(session_key)

    async def request(self, session_key: str) -> float:
        """Record and broadcast a stop for ``session_key``; returns its timestamp."""
        at = await server_time(self._r)
        await self._r.set(self.key(session_key), repr(at), ex=CANCEL_TTL_S)
        await self._broadcast.publish(self.channel, {"session": session_key, "at": at})
        return at

    async def stopped_since(self, session_key: str, started_at: float) -> bool:
        """True when a stop was requested at or after ``started_at``."""
        return stopped_since_value(await self._r.get(self.key(session_key)), started_at)


def stopped_since_value(raw: str | bytes | None, started_at: float) -> bool:
    """Whether a stored stop time (``CancelSignals.key``) is at or after ``started_at``."""
    return raw is not None and float(raw) >= started_at


OUTCOME_TTL_S = 24 * 3600


class OutcomeBoard:
    def __init__(self, client: aioredis.Redis, prefix: str, broadcast: Broadcast) -> None:
        self._r = client
        self._keys = Keys(prefix)
        self._broadcast = broadcast
        self._events: dict[str, asyncio.Event] = {}
        broadcast.on(self.channel, self._on_message)

    @property
    def channel(self) -> str:
        return self._keys.outcomes_channel()

    def _key(self, run_id: str) -> str:
        return self._keys.outcome(run_id)

    async def publish(self, run_ids: list[str], outcome: RunOutcome) -> None:
        if not run_ids:
            return
        data = json.dumps(outcome.wire())
        pipe = self._r.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.set(self._key(run_id), data, ex=OUTCOME_TTL_S)
        await pipe.execute()
        for run_id in run_ids:
            await self._broadcast.publish(self.channel, {"run_id": run_id})

    async def wait(self, run_id: str, timeout_s: float) -> RunOutcome | None:
        """The outcome of ``run_id``, or None if none arrived within ``timeout_s``."""
        event = self._events.setdefault(run_id, asyncio.Event())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while True:
                raw = await self._r.get(self._key(run_id))
                if raw:
                    return RunOutcome(**json.loads(raw))
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout=min(1.0, remaining))
                event.clear()
        finally:
            self._events.pop(run_id, None)

    async def _on_message(self, data: dict[str, str]) -> None:
        event = self._events.get(str(data.get("run_id")))
        if event is not None:
            event.set()
