"""A ChannelContext for exercising a channel adapter without the gateway.

``submit`` records the requests (and can be made to fail or answer a given status),
``kv`` is the KeyValue contract over a real Redis, ``add_route`` goes into a real
aiohttp application served on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web

from agent.types import RunRequest
from bot.session_keys import session_key
from channels.base import ChannelContext, KeyWrite, RouteHandler, Scope, SubmitResult
from channels.telegram.adapter import TelegramChannel
from channels.telegram.settings import TelegramSettings
from tests.fakes.telegram_server import FakeTelegram

_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


class RedisKV:
    """The KeyValue protocol on real Redis, every key under a test prefix."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    def _k(self, key: str) -> str:
        return f"{self.prefix}:{key}"

    async def set_nx(self, key: str, value: str, ttl_s: float) -> bool:
        return bool(await self.client.set(self._k(key), value, nx=True, px=max(1, int(ttl_s * 1000))))

    async def get(self, key: str) -> str | None:
        value = await self.client.get(self._k(key))
        return None if value is None else str(value)

    async def set(self, key: str, value: str, ttl_s: float | None = None) -> None:
        await self.client.set(self._k(key), value, px=int(ttl_s * 1000) if ttl_s else None)

    async def set_many(self, writes: Sequence[KeyWrite]) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            for key, value, ttl_s in writes:
                pipe.set(self._k(key), value, px=int(ttl_s * 1000) if ttl_s else None)
            await pipe.execute()

    async def delete(self, key: str) -> None:
        await self.client.delete(self._k(key))

    async def extend_if_owner(self, key: str, value: str, ttl_s: float) -> bool:
        result = await self.client.eval(_EXTEND, 1, self._k(key), value, str(max(1, int(ttl_s * 1000))))
        return bool(result)


class RecordingContext:
    """Builds ChannelContexts whose submit() records every RunRequest."""

    def __init__(self, kv: RedisKV, *, agent_id: str = "main", app: web.Application | None = None,
                 commands: tuple[tuple[str, str], ...] = (("stop", "Stop the current run"), ("new", "Start over"))) -> None:
        self.kv = kv
        self.agent_id = agent_id
        self.app = app or web.Application()
        self.commands = commands
        self.requests: list[RunRequest] = []
        self.status = "queued"
        self.fail_with: BaseException | None = None
        self.submit_delay_s = 0.0
        self._changed = asyncio.Condition()

    def context(self, replica_id: str = "replica-a") -> ChannelContext:
        return ChannelContext(
            submit=self.submit,
            session_key=self.session_key,
            kv=self.kv,
            add_route=self.add_route,
            replica_id=replica_id,
            commands=self.commands,
        )

    def session_key(self, scope: Scope, chat_id: str, *, thread: str | None = None, topic: str | None = None) -> str:
        return session_key(self.agent_id, "telegram", scope, chat_id, thread=thread, topic=topic)

    def add_route(self, method: str, path: str, handler: RouteHandler) -> None:
        self.app.router.add_route(method, path, handler)

    async def submit(self, request: RunRequest) -> SubmitResult:
        if self.submit_delay_s:
            await asyncio.sleep(self.submit_delay_s)
        if self.fail_with is not None:
            raise self.fail_with
        duplicate = any(r.dedupe_key == request.dedupe_key for r in self.requests)
        self.requests.append(request)
        async with self._changed:
            self._changed.notify_all()
        return SubmitResult("duplicate" if duplicate else self.status)

    @property
    def unique(self) -> list[RunRequest]:
        """Requests with distinct dedupe keys (what the gateway would run)."""
        seen: set[str | None] = set()
        out = []
        for r in self.requests:
            if r.dedupe_key not in seen:
                seen.add(r.dedupe_key)
                out.append(r)
        return out

    async def wait_for(self, predicate: Callable[[list[RunRequest]], bool], within_s: float = 5.0) -> list[RunRequest]:
        async with asyncio.timeout(within_s), self._changed:
            await self._changed.wait_for(lambda: predicate(self.requests))
        return self.requests

    async def wait_requests(self, count: int, within_s: float = 5.0) -> list[RunRequest]:
        return await self.wait_for(lambda reqs: len(reqs) >= count, within_s)


class TelegramHarness:
    """A fake Bot API, a recording context and the adapters started against them.

    ``async with TelegramHarness(redis_client, prefix) as h: ch = await h.channel(...)``;
    every channel is stopped and the HTTP app (if served) shut down on exit.
    """

    def __init__(self, client: aioredis.Redis, prefix: str, **settings: Any) -> None:
        self.fake = FakeTelegram()
        self.recorder = RecordingContext(RedisKV(client, prefix))
        self.settings = settings
        self.channels: list[TelegramChannel] = []
        self._runner: web.AppRunner | None = None
        # Bound now so the webhook URL is known before the channel starts.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.http_base = f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    async def __aenter__(self) -> TelegramHarness:
        await self.fake.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for channel in reversed(self.channels):
            await channel.aclose()
        if self._runner is not None:
            await self._runner.cleanup()
        self._sock.close()
        await self.fake.stop()

    def make_settings(self, **overrides: Any) -> TelegramSettings:
        values: dict[str, Any] = {"token": self.fake.token, "api_base_url": self.fake.base_url,
                                     "allow_from": ("42",), "groups": ("*",), "stream_edit_interval_s": 0.3}
        values.update(self.settings)
        values.update(overrides)
        return TelegramSettings(**values)

    async def channel(self, *, replica_id: str = "replica-a", start: bool = True, tuning: dict[str, Any] | None = None,
                      **overrides: Any) -> TelegramChannel:
        opts: dict[str, Any] = {"lease_ttl_s": 3.0, "lease_renew_s": 0.5, "poll_timeout_s": 1,
                                   "poll_backoff_s": 0.05, "send_backoff_s": 0.05, "typing_interval_s": 0.5}
        opts.update(tuning or {})
        channel = TelegramChannel(self.make_settings(**{**opts, **overrides}))
        self.channels.append(channel)
        if start:
            await channel.start(self.recorder.context(replica_id))
        return channel

    async def serve_http(self) -> str:
        """Serve the routes added so far at ``http_base``."""
        self._runner = web.AppRunner(self.recorder.app, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()
        return self.http_base
