"""Counting what this process sends to Redis: one entry per request on the wire (a
pipeline or a script call is one), so a test can pin how many round trips a step costs
and which keys it touched."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import AbstractConnection

from bot.store.pool import PromptWrite


class StoreRequests:
    """From construction on, every request this process sends to Redis, as its raw
    bytes (commands and keys can be looked for in them)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[bytes] = []
        # botd's own connections write through PromptWrite's override, the rest through redis-py's.
        for cls in (AbstractConnection, PromptWrite):
            monkeypatch.setattr(cls, "send_packed_command", self._counting(cls.send_packed_command))

    def _counting(self, original: Any) -> Any:
        async def counted(conn: Any, command: Any, check_health: bool = True) -> None:
            if not getattr(conn, "_counted", False):  # PromptWrite falling back to redis-py's write
                chunks = [command] if isinstance(command, bytes | bytearray | memoryview) else list(command)
                self.sent.append(b"".join(bytes(c) for c in chunks))
            conn._counted = True
            try:
                await original(conn, command, check_health)
            finally:
                conn._counted = False

        return counted

    def reset(self) -> None:
        self.sent.clear()

    @property
    def count(self) -> int:
        return len(self.sent)

    def touching(self, fragment: str) -> list[bytes]:
        """The requests whose bytes contain ``fragment`` (a key, or a part of one)."""
        needle = fragment.encode()
        return [r for r in self.sent if needle in r]

    def commands(self, fragment: str) -> list[str]:
        """The command names (upper case) of the requests touching ``fragment``, in order;
        a pipeline's commands joined by "+" (e.g. "SET+SET")."""
        return ["+".join(_names(r)) for r in self.touching(fragment)]


def _names(request: bytes) -> list[str]:
    """The command names in a RESP request: the first bulk string of each array."""
    names, pos = [], 0
    while pos < len(request):
        end = request.index(b"\r\n", pos)
        count, pos = int(request[pos + 1 : end]), end + 2  # "*<count>"
        for n in range(count):
            end = request.index(b"\r\n", pos)
            size = int(request[pos + 1 : end])  # "$<size>"
            value, pos = request[end + 2 : end + 2 + size], end + 4 + size
            if n == 0:
                names.append(value.decode(errors="replace").upper())
    return names
