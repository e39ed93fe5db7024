"""AcceptGate: a deadline per inbound request, a bound on concurrent ones, and work that
is never cut off midway."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from channels.slack.acceptance import AcceptGate
from channels.slack.intake import Outcome


def slow_work(seconds: float, finished: asyncio.Event) -> Callable[[], Awaitable[Outcome]]:
    """Work that takes ``seconds`` and then notes that it ran to its end."""

    async def work() -> Outcome:
        await asyncio.sleep(seconds)
        finished.set()
        return Outcome("submitted")

    return work


async def test_work_within_the_deadline_is_accepted() -> None:
    gate = AcceptGate(4)

    async def work() -> Outcome:
        await asyncio.sleep(0.01)
        return Outcome("submitted", "queued")

    assert await gate.accept("event", work, 1.0) == Outcome("submitted", "queued")


async def test_work_past_the_deadline_is_not_accepted_but_finishes() -> None:
    gate = AcceptGate(4)
    finished = asyncio.Event()
    assert await gate.accept("event", slow_work(0.2, finished), 0.05) == Outcome("failed", "timeout")
    await asyncio.wait_for(finished.wait(), 2)  # left to finish, never cancelled
    await gate.drain(1)


async def test_no_free_slot_before_the_deadline_is_busy() -> None:
    gate = AcceptGate(1)
    release = asyncio.Event()

    async def holder() -> Outcome:
        await release.wait()
        return Outcome("submitted")

    async def quick() -> Outcome:
        return Outcome("submitted")

    held = asyncio.create_task(gate.accept("event", holder, 5))
    await asyncio.sleep(0.01)
    assert await gate.accept("event", quick, 0.05) == Outcome("failed", "busy")
    release.set()
    assert await held == Outcome("submitted")
    assert await gate.accept("event", quick, 0.05) == Outcome("submitted")  # the slot came back


async def test_a_cancelled_caller_does_not_cancel_the_work() -> None:
    gate = AcceptGate(2)
    finished = asyncio.Event()
    caller = asyncio.create_task(gate.accept("event", slow_work(0.1, finished), 5))
    await asyncio.sleep(0.01)
    caller.cancel()
    await asyncio.gather(caller, return_exceptions=True)
    await asyncio.wait_for(finished.wait(), 2)


async def test_failing_work_is_not_accepted() -> None:
    gate = AcceptGate(2)

    async def broken() -> Outcome:
        raise ConnectionError("store down")

    assert await gate.accept("event", broken, 1) == Outcome("failed", "ConnectionError")
