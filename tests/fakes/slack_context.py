"""A ChannelContext for driving the Slack channel without the gateway.

``submit`` records RunRequests after the gateway's own dedupe (the real code: a message
is marked atomically with its enqueue, a command in two stages), the key-value store is
real Redis (the test fixture's client), and ``add_route`` mounts handlers on a real
aiohttp server on 127.0.0.1.
``refuse(n)`` makes the next ``n`` submits answer ``error`` the way the gateway does
when Redis is down (recorded in ``refused``, not in ``requests``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Literal

import redis.asyncio as aioredis
from aiohttp import web

from agent.types import RunRequest
from bot.gateway.control import parse_command
from bot.gateway.inbox import Deduper, Inbox
from bot.session_keys import session_key
from bot.store.keys import Keys
from bot.store.kv import RedisKeyValue as StoreKeyValue
from channels.base import ChannelContext, RouteHandler, SubmitResult
from channels.slack.intake import Outcome
from tests.fakes import serving_app


class RedisKeyValue(StoreKeyValue):
    """The daemon's KeyValue on the test's Redis, plus ``ttl`` for assertions."""

    @property
    def client(self) -> aioredis.Redis:
        return self._client

    @property
    def keys(self) -> Keys:
        return self._keys

    async def ttl(self, key: str) -> int:
        return int(await self._client.ttl(self._keys.kv(key)))


Status = Literal["queued", "duplicate", "command", "denied", "dropped", "error"]


class RecordingContext:
    """Records submits and the channel's inbound outcomes; serves added routes."""

    def __init__(self, kv: RedisKeyValue, *, agent_id: str = "main", status: Status = "queued") -> None:
        self.kv = kv
        self.dedupe = Deduper(kv.client, kv.keys)
        self._inbox = Inbox(kv.client, kv.keys.prefix)
        self.status: Status = status
        self.fail_submit: Exception | None = None
        self.refusals = 0
        self.refused: list[RunRequest] = []
        self.requests: list[RunRequest] = []
        self.outcomes: list[tuple[str, Outcome]] = []
        self.routes: list[tuple[str, str, RouteHandler]] = []
        self._changed = asyncio.Condition()
        self.ctx = ChannelContext(
            submit=self.submit,
            session_key=partial(session_key, agent_id, "slack"),
            kv=kv,
            add_route=self.add_route,
            replica_id="test-replica",
        )

    def refuse(self, times: int) -> None:
        """The next ``times`` submits answer ``SubmitResult("error")`` (not accepted)."""
        self.refusals = times

    async def submit(self, request: RunRequest) -> SubmitResult:
        if self.fail_submit is not None:
            raise self.fail_submit
        if self.refusals > 0:
            self.refusals -= 1
            self.refused.append(request)
            await self._notify()
            return SubmitResult("error", "store unavailable")
        command = parse_command(request.text)
        claim = await self.dedupe.claim(request.dedupe_key) if command and request.dedupe_key else None
        if claim is not None and claim.status != "first":
            return SubmitResult("duplicate") if claim.status == "duplicate" else SubmitResult("error", "in flight")
        if command is None and (await self._inbox.enqueue(request, 1000, dedupe_key=request.dedupe_key)).duplicate:
            return SubmitResult("duplicate")
        self.requests.append(request)
        if claim is not None:
            await self.dedupe.confirm(claim)
        await self._notify()
        status: Status = self.status
        if request.text.startswith("/"):
            status = "command"
        return SubmitResult(status)

    def add_route(self, method: str, path: str, handler: RouteHandler) -> None:
        self.routes.append((method, path, handler))

    def observe(self, kind: str, outcome: Outcome) -> None:
        self.outcomes.append((kind, outcome))
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_until(self, predicate: Callable[[], bool], within: float = 5.0) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), within)

    async def wait_requests(self, count: int = 1, within: float = 5.0) -> list[RunRequest]:
        await self.wait_until(lambda: len(self.requests) >= count, within)
        return self.requests

    async def wait_outcomes(self, count: int, within: float = 5.0) -> list[tuple[str, Outcome]]:
        await self.wait_until(lambda: len(self.outcomes) >= count, within)
        return self.outcomes

    @asynccontextmanager
    async def serve(self, max_body_bytes: int = 1_048_576) -> AsyncIterator[str]:
        """Serve the added routes on 127.0.0.1; yields the base URL."""
        app = web.Application(client_max_size=max_body_bytes)
        for method, path, handler in self.routes:
            app.router.add_route(method, path, handler)
        async with serving_app(app) as base_url:
            yield base_url
