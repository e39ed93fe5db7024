"""Cancelling tasks reliably.

redis-py's asyncio client (8.x) sometimes swallows a cancellation that lands while a
command is in flight: the call returns normally and the task carries on. One
``task.cancel()`` is therefore not enough for anything that must stop; these helpers
keep cancelling until the task has really finished.
"""

from __future__ import annotations

import asyncio
from typing import Any

RETRY_S = 0.2


async def stop_task(task: asyncio.Task[Any] | None, *, attempts: int = 50) -> None:
    """Cancel ``task`` and wait for it to end, re-cancelling if a cancellation was lost."""
    if task is None or task is asyncio.current_task():
        return
    for _ in range(attempts):
        if task.done():
            break
        task.cancel()
        await asyncio.wait([task], timeout=RETRY_S)
    if task.done() and not task.cancelled():
        task.exception()  # mark retrieved; the task's own error was already handled or logged
