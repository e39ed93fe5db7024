"""A ChannelContext for driving the Slack channel without the gateway.

``submit`` records RunRequests, the key-value store is real Redis (the test fixture's
client), and ``add_route`` mounts handlers on a real aiohttp server on 127.0.0.1.
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
from bot.session_keys import session_key
from channels.base import ChannelContext, RouteHandler, SubmitResult
from channels.slack.intake import Outcome

_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


class RedisKeyValue:
    """channels.base.KeyValue over redis.asyncio, every key under ``prefix:``."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._r = client
        self._prefix = prefix

    def _k(self, key: str) -> str:
        return f"{self._prefix}:{key}"

    async def set_nx(self, key: str, value: str, ttl_s: float) -> bool:
        return bool(await self._r.set(self._k(key), value, nx=True, px=max(1, int(ttl_s * 1000))))

    async def get(self, key: str) -> str | None:
        value = await self._r.get(self._k(key))
        return None if value is None else str(value)

    async def set(self, key: str, value: str, ttl_s: float | None = None) -> None:
        if ttl_s is None:
            await self._r.set(self._k(key), value)
        else:
            await self._r.set(self._k(key), value, px=max(1, int(ttl_s * 1000)))

    async def delete(self, key: str) -> None:
        await self._r.delete(self._k(key))

    async def extend_if_owner(self, key: str, value: str, ttl_s: float) -> bool:
        result = await self._r.eval(_EXTEND, 1, self._k(key), value, int(ttl_s * 1000))  # type: ignore[misc]
        return bool(result)

    async def ttl(self, key: str) -> int:
        return int(await self._r.ttl(self._k(key)))


Status = Literal["queued", "duplicate", "command", "denied", "dropped", "error"]


class RecordingContext:
    """Records submits and the channel's inbound outcomes; serves added routes."""

    def __init__(self, kv: RedisKeyValue, *, agent_id: str = "main", status: Status = "queued") -> None:
        self.kv = kv
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
        self.requests.append(request)
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
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()
