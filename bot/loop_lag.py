"""Event-loop lag watchdog: a blocked loop delays every chat, so measure and export it."""

from __future__ import annotations

import asyncio

import structlog

from bot import metrics

log = structlog.get_logger(__name__)


class LoopLagMonitor:
    """Every ``interval_s`` a timer callback notes how late it fired. A bare callback, not
    a task sleeping in a loop: the same measure without a coroutine step and a future per
    sample (it runs twice a second for the daemon's whole life, idle or not)."""

    def __init__(self, interval_s: float = 0.5, warn_s: float = 0.5) -> None:
        self._interval = interval_s
        self._warn = warn_s
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0
        self.last_lag = 0.0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._due = loop.time() + self._interval
        self._timer = loop.call_at(self._due, self._sample, loop)

    def _sample(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        lag = max(0.0, now - self._due)
        self.last_lag = lag
        metrics.LOOP_LAG.set(lag)
        if lag > self._warn:
            log.warning("loop.lag", seconds=round(lag, 3))
        self._due = now + self._interval
        self._timer = loop.call_at(self._due, self._sample, loop)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
