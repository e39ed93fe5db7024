"""The event-loop lag monitor: a blocked loop shows up in ``last_lag`` and the gauge."""

from __future__ import annotations

import asyncio
import time

from bot import metrics
from bot.loop_lag import LoopLagMonitor


async def test_a_blocked_loop_is_measured_and_exported() -> None:
    monitor = LoopLagMonitor(interval_s=0.05, warn_s=10.0)
    monitor.start()
    try:
        await asyncio.sleep(0.12)  # a few samples of a loop that is not blocked
        time.sleep(0.3)  # noqa: ASYNC251 -- blocking the loop is the point: the sample due meanwhile fires >= 0.25 s late
        await asyncio.sleep(0.001)  # the late sample runs; the next one is due 50 ms after it
        assert monitor.last_lag >= 0.25
        assert metrics.LOOP_LAG._value.get() >= 0.25
    finally:
        await monitor.stop()
    assert monitor._timer is None


async def test_stop_ends_sampling() -> None:
    monitor = LoopLagMonitor(interval_s=0.01)
    monitor.start()
    await monitor.stop()
    monitor.last_lag = -1.0
    await asyncio.sleep(0.05)
    assert monitor.last_lag == -1.0  # no sample ran after stop
