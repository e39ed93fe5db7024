"""An in-process channel that records everything the gateway asks it to show.

Gateway tests use it where the platform is not the point; Telegram and Slack have
their own fakes that speak the real wire formats.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field

from channels.base import ChannelContext, ReplyStream, Target


@dataclass
class Sent:
    chat_id: str
    text: str
    run_id: str | None
    kind: str  # "part" | "notice" | "approval"
    index: int = 0


@dataclass
class RecordingChannel:
    name: str = "test"
    sent: list[Sent] = field(default_factory=list)
    previews: list[tuple[str, str]] = field(default_factory=list)
    discarded: list[str] = field(default_factory=list)
    approvals: list[tuple[str, str]] = field(default_factory=list)
    opened: list[tuple[str, bool]] = field(default_factory=list)  # (run_id, resumed) per stream
    fail_deliveries: int = 0
    part_limit: int = 0
    ctx: ChannelContext | None = None
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self, ctx: ChannelContext) -> None:
        self.ctx = ctx

    async def stop(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def is_ready(self) -> bool:
        return True

    def format_parts(self, markdown: str) -> list[str]:
        if self.part_limit <= 0:
            return [markdown]
        return [markdown[i : i + self.part_limit] for i in range(0, len(markdown), self.part_limit)]

    def open_stream(self, target: Target, run_id: str, *, resumed: bool = True) -> ReplyStream:
        self.opened.append((run_id, resumed))
        return _Stream(self, target, run_id)

    async def send_text(self, target: Target, text: str) -> str | None:
        self._record(Sent(target.chat_id, text, None, "notice"))
        return str(next(self._ids))

    async def ask_approval(self, target: Target, approval_id: str, summary: str) -> None:
        self.approvals.append((approval_id, summary))
        self._record(Sent(target.chat_id, summary, None, "approval"))

    def _record(self, item: Sent) -> None:
        self.sent.append(item)
        self._changed.set()

    def texts(self, kind: str | None = None) -> list[str]:
        return [s.text for s in self.sent if kind is None or s.kind == kind]

    async def wait_for(self, predicate: object, timeout: float = 10.0) -> None:
        """Wait until ``predicate(self)`` is true."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate(self):  # type: ignore[operator]
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"timed out; sent so far: {self.sent}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 0.05))


class _Stream:
    def __init__(self, channel: RecordingChannel, target: Target, run_id: str) -> None:
        self._ch = channel
        self._target = target
        self._run_id = run_id

    async def start(self) -> None:
        return None

    async def preview(self, text: str) -> None:
        self._ch.previews.append((self._run_id, text))

    async def deliver(self, index: int, part: str) -> str | None:
        if self._ch.fail_deliveries > 0:
            self._ch.fail_deliveries -= 1
            raise RuntimeError("simulated send failure")
        self._ch._record(Sent(self._target.chat_id, part, self._run_id, "part", index))
        return str(next(self._ch._ids))

    async def discard(self) -> None:
        self._ch.discarded.append(self._run_id)
        self._ch._changed.set()

    async def close(self) -> None:
        return None
