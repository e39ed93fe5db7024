"""The per-path memory part counts every answer, refusal and loss, though its chats wait
on their answers concurrently (a count read before the wait would lose updates)."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from typing import Any

from bench.paths_parts import Bench, part_memory
from bench.paths_probes import StoreCounters
from bench.paths_rig import Refused
from bench.replicas_fleet import mark_of


class StubPath:
    """Answers every chat after a short, varying delay; refuses and drops the ones asked."""

    name = "stub"
    refusals = 0

    def __init__(self, refuse: set[int], drop: set[int]) -> None:
        self.pid = os.getpid()  # the tree whose RSS is read: this process
        self.refuse, self.drop = refuse, drop
        self.waiting: dict[str, asyncio.Future[float]] = {}

    def expect(self, mark: str) -> asyncio.Future[float]:
        self.waiting[mark] = asyncio.get_running_loop().create_future()
        return self.waiting[mark]

    async def send(self, session: int, message: int) -> None:
        if session in self.refuse:
            raise Refused("busy")
        if session not in self.drop:
            loop = asyncio.get_running_loop()
            fut = self.waiting[mark_of(session, message)]
            loop.call_later(0.001 * (session % 7), lambda: fut.done() or fut.set_result(loop.time()))

    def platform_calls(self) -> Counter[str]:
        return Counter()


class StubStore:
    async def counters(self) -> StoreCounters:
        return StoreCounters(Counter(), 0)

    async def used_memory(self) -> int:
        return 1 << 20


class StubLog:
    def poll(self) -> int:
        return 0

    async def wait_runs(self, count: int, timeout_s: float) -> bool:
        return True


class StubLLM:
    pid = os.getpid()
    root = "unused"


class StubBench(Bench):
    async def set_latency(self, ms: float) -> None:
        return None


async def test_every_chat_is_counted_once() -> None:
    path = StubPath(refuse={5, 17}, drop={30})
    stub: Any = path
    bench = StubBench(stub, StubLLM(), stub, StubStore(), StubLog(), reply_timeout_s=0.2)  # type: ignore[arg-type]

    result = await part_memory(bench, sessions=60, in_flight=8, settle_s=0)

    assert (result["answered"], result["refused"], result["missing"]) == (57, 2, 1)
    assert [c["sessions"] for c in result["checkpoints"]] == list(range(0, 61, 6))
    assert result["store_used_bytes_per_session"] == 0
    assert result["after"]["botd_rss_bytes"] > 0
