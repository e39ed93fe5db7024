"""Heap trimming after a burst: only once runs finished and none is active, never fatal."""

from __future__ import annotations

import asyncio
import platform
from pathlib import Path

import pytest

from bot.heap import HeapTrimmer, load_malloc_trim

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")


class Counters:
    def __init__(self) -> None:
        self.finished = 0.0
        self.active = 0
        self.trims: list[int] = []

    def trim(self, pad: int) -> int:
        self.trims.append(pad)
        return 1


def trimmer(c: Counters, **kwargs: object) -> HeapTrimmer:
    return HeapTrimmer(0.01, trim=c.trim, runs_finished=lambda: c.finished, active_runs=lambda: c.active, **kwargs)


async def test_trims_once_after_runs_finished_and_none_is_active() -> None:
    c = Counters()
    t = trimmer(c)
    t.start()
    try:
        await asyncio.sleep(0.05)
        assert c.trims == []  # nothing ran since start: nothing to give back
        c.finished, c.active = 3, 1
        await asyncio.sleep(0.05)
        assert c.trims == []  # a run is still going
        c.active = 0
        await asyncio.sleep(0.05)
        assert c.trims == [0]  # once, with no padding kept
        await asyncio.sleep(0.05)
        assert c.trims == [0]  # quiet since: no second trim
        c.finished = 4
        await asyncio.sleep(0.05)
        assert c.trims == [0, 0]
    finally:
        t.stop()


async def test_a_failing_trim_does_not_end_the_checks() -> None:
    c = Counters()
    calls = 0

    def broken(pad: int) -> int:
        nonlocal calls
        calls += 1
        raise OSError("boom")

    t = HeapTrimmer(0.01, trim=broken, runs_finished=lambda: c.finished, active_runs=lambda: 0)
    t.start()
    try:
        c.finished = 1
        await asyncio.sleep(0.05)
        c.finished = 2
        await asyncio.sleep(0.05)
        assert calls == 2
    finally:
        t.stop()
    assert t._timer is None


async def test_without_malloc_trim_nothing_is_scheduled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bot.heap.load_malloc_trim", lambda: None)
    t = HeapTrimmer(0.01)
    assert not t.available
    t.start()
    assert t._timer is None
    t.stop()


@glibc_only
def test_malloc_trim_gives_free_heap_pages_back() -> None:
    trim = load_malloc_trim()
    assert trim is not None
    statm = Path("/proc/self/statm")

    def rss() -> int:
        return int(statm.read_text().split()[1]) * 4096

    # 32 MiB of 16 KiB blocks (under glibc's mmap threshold: they live in the heap), then
    # one more that stays alive above them, so free() cannot shrink the heap from its top.
    blocks = [bytearray(16384) for _ in range(2048)]
    for b in blocks:
        b[::4096] = b"\1" * 4  # touch every page
    pin = bytearray(16384)
    del blocks
    freed = rss()
    trim(0)
    assert freed - rss() > 16 * 2**20
    del pin
