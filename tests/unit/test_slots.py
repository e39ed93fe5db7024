"""``agent.tasks.Slots``: a free slot is taken without awaiting, waiters are served in
order, and a waiter cancelled at any point neither keeps nor loses a slot."""

from __future__ import annotations

import asyncio

import pytest

from agent.tasks import Slots


async def test_a_free_slot_is_taken_at_once_and_none_beyond_the_size() -> None:
    slots = Slots(2)
    assert slots.take_now() and slots.take_now()
    assert not slots.take_now()
    slots.give()
    assert slots.take_now()


async def test_waiters_are_served_in_order_and_before_a_later_take_now() -> None:
    slots = Slots(1)
    assert slots.take_now()
    served: list[str] = []

    async def wait(name: str) -> None:
        await slots.take()
        served.append(name)

    first, second = asyncio.create_task(wait("first")), asyncio.create_task(wait("second"))
    await asyncio.sleep(0)
    assert slots.contended
    slots.give()
    assert not slots.take_now()  # handed to the first waiter, not to whoever asks next
    await asyncio.sleep(0)
    assert served == ["first"]
    slots.give()
    await asyncio.wait_for(second, 1)
    await first
    assert served == ["first", "second"] and not slots.contended
    slots.give()
    assert slots.take_now()


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    slots = Slots(1)
    assert slots.take_now()
    waiter = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not slots.contended
    slots.give()
    assert slots.take_now()


async def test_a_waiter_cancelled_just_as_it_is_handed_a_slot_passes_it_on() -> None:
    slots = Slots(1)
    assert slots.take_now()
    waiter = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    slots.give()  # handed to the waiter, which has not run yet
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert slots.take_now()  # the slot came back instead of leaking
    assert not slots.take_now()


async def test_a_timed_out_wait_keeps_nothing() -> None:
    slots = Slots(1)
    assert slots.take_now()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await slots.take()
    assert not slots.contended
    slots.give()
    assert slots.take_now()
