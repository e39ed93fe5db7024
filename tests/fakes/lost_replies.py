"""A store that applies a request and never answers it.

Valkey queues a command's reply and writes it when its event loop next sleeps; a
shutdown in between (or a connection dropped at that moment) leaves the command applied
and its reply unsent. The client sees a connection error, and redis-py sends the same
request again. Steps whose retry must still read as their own are tested with this."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from bot.store.pool import LeanPipeline, LeanRedis


class LostReplies:
    """The next ``times`` requests (a command, a pipeline or a transaction) of the
    daemon's client holding a command named in ``commands`` (any, by default) that names
    ``marker`` in a key or argument are applied by the server; then the connection drops
    before their reply is read."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, marker: str, times: int, *, commands: tuple[str, ...] = (),
        rate: float = 1.0, seed: int = 0, meanwhile: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """With ``rate`` below 1, each matching request is lost with that chance (drawn
        from ``seed``, so a failure reproduces), until ``times`` were. ``meanwhile`` runs
        after a request was applied and before its retry (what others did in between)."""
        self.marker = marker
        self.meanwhile = meanwhile
        self.commands = {c.upper() for c in commands}
        self.rate = rate
        self._rng = random.Random(seed)
        self.left = times
        self.lost = 0
        send_and_read = LeanRedis._send_and_read
        transaction, pipeline = LeanPipeline._transaction, LeanPipeline._pipeline

        async def command(client: LeanRedis, conn: Any, name: str, args: Any, options: Any) -> Any:
            reply = await send_and_read(client, conn, name, args, options)
            await self._maybe_lose(conn, [args])
            return reply

        def batch(original: Any) -> Any:
            async def execute(pipe: LeanPipeline, conn: Any, commands: Any, raise_on_error: bool) -> list[Any]:
                replies: list[Any] = await original(pipe, conn, commands, raise_on_error)
                await self._maybe_lose(conn, [args for args, _ in commands])
                return replies
            return execute

        monkeypatch.setattr(LeanRedis, "_send_and_read", command)
        monkeypatch.setattr(LeanPipeline, "_transaction", batch(transaction))
        monkeypatch.setattr(LeanPipeline, "_pipeline", batch(pipeline))

    async def _maybe_lose(self, conn: Any, commands: list[Any]) -> None:
        if self.left and any(self._matches(args) for args in commands) and self._rng.random() < self.rate:
            self.left -= 1
            self.lost += 1
            await conn.disconnect()
            if self.meanwhile is not None:
                await self.meanwhile()
            raise RedisConnectionError("Connection closed by server.")

    def _matches(self, args: Any) -> bool:
        if self.commands and str(args[0]).upper() not in self.commands:
            return False
        return any(self.marker in str(arg) for arg in args)
