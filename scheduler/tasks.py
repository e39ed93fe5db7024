"""Background tasks the scheduler owns: spawned with error logging, stopped for sure.

redis-py can swallow a cancellation that lands while it (re)connects (a
long-standing upstream issue), so stopping cancels *again* until the task is
done, within a bound, rather than trusting one ``cancel()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any

import structlog

log = structlog.get_logger(__name__)


async def cancel_all(tasks: Iterable[asyncio.Task[Any]], within_s: float = 5.0) -> None:
    """Cancel ``tasks`` and wait for them, re-cancelling any that keep running."""
    pending = {task for task in tasks if not task.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while pending and loop.time() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.1)
    if pending:
        log.warning("scheduler.tasks_not_stopped", count=len(pending))


class TaskSet:
    """Fire-and-forget tasks that are still tracked, logged when they fail, and drained on stop."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def tasks(self) -> set[asyncio.Task[Any]]:
        return set(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str | None = None) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("scheduler.task_failed", task=task.get_name(), error=repr(task.exception()))


async def drain(tasks: Iterable[asyncio.Task[Any]], grace_s: float) -> None:
    """Let ``tasks`` finish for up to ``grace_s``, then cancel what is left."""
    pending = {task for task in tasks if not task.done()}
    if not pending:
        return
    _, late = await asyncio.wait(pending, timeout=max(grace_s, 0.0))
    await cancel_all(late)
