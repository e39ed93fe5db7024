"""Event-loop lag watchdog: a blocked loop delays every chat, so measure and export it."""

from __future__ import annotations

import asyncio
import time

import structlog

from agent.tasks import stop_task
from bot import metrics

log = structlog.get_logger(__name__)


class LoopLagMonitor:
    def __init__(self, interval_s: float = 0.5, warn_s: float = 0.5) -> None:
        self._interval = interval_s
        self._warn = warn_s
        self._task: asyncio.Task[None] | None = None
        self.last_lag = 0.0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="loop-lag")

    async def _run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(self._interval)
            lag = max(0.0, time.monotonic() - before - self._interval)
            self.last_lag = lag
            metrics.LOOP_LAG.set(lag)
            if lag > self._warn:
                log.warning("loop.lag", seconds=round(lag, 3))

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None
