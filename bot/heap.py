"""Give the C heap's free pages back to the system once the daemon has gone quiet.

A burst of runs grows glibc's heap (request and response bodies, decoded JSON, connection
buffers). Freeing them returns the memory to glibc but not to the system: ``free`` only
shrinks the heap from its top, so one live block above the freed ones pins them all, and
after a burst of a hundred runs about 6 MiB of free heap stayed resident for the life of
the process. ``malloc_trim(0)`` hands back every free page, wherever it is in the heap;
it takes about a millisecond, so it runs only when runs finished since the last trim and
none is in progress. Elsewhere than glibc (musl, macOS) there is no ``malloc_trim`` and
nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable

import structlog

from bot import metrics

log = structlog.get_logger(__name__)

TRIM_CHECK_S = 2.0


def load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` from the process's own symbols, or None where libc has none."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


class HeapTrimmer:
    """Every ``interval_s`` a timer callback checks whether runs finished since the last
    look and none is active; if so it trims. ``runs_finished`` and ``active_runs`` default
    to the daemon's metrics (both counted on this replica)."""

    def __init__(
        self,
        interval_s: float = TRIM_CHECK_S,
        *,
        trim: Callable[[int], int] | None = None,
        runs_finished: Callable[[], float] = metrics.runs_finished,
        active_runs: Callable[[], int] = metrics.active_runs,
    ) -> None:
        self._interval = interval_s
        self._trim = trim if trim is not None else load_malloc_trim()
        self._runs_finished = runs_finished
        self._active_runs = active_runs
        self._seen = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.trims = 0

    @property
    def available(self) -> bool:
        return self._trim is not None

    def start(self) -> None:
        if self._trim is None:
            return  # not glibc: nothing to give back this way
        self._seen = self._runs_finished()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._interval, self._check, loop)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            finished = self._runs_finished()
            if finished != self._seen and self._active_runs() == 0:
                self._seen = finished
                assert self._trim is not None
                self._trim(0)
                self.trims += 1
        except Exception as exc:  # never let housekeeping end the daemon's timer chain
            log.warning("heap.trim_failed", error=str(exc))
        self._timer = loop.call_later(self._interval, self._check, loop)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
