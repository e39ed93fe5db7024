"""Background tasks that stop for sure (the one home of the cancellation workarounds),
and the slots tasks take turns on.

Some libraries swallow a cancellation that lands while a call is in flight: redis-py's
asyncio client (8.x) while a command runs or it (re)connects, and the HTTP stack
(httpcore on anyio) under the Telegram client. The call returns normally and the task
carries on, still marked as cancelling. One ``task.cancel()`` is therefore not enough
for anything that must stop: these helpers cancel *again* until the task has really
finished (within a bound), and let a loop re-raise a cancellation a call swallowed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import structlog

log = structlog.get_logger(__name__)

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
        log.warning("tasks.not_stopped", count=len(pending))


async def drain(tasks: Iterable[asyncio.Task[Any]], grace_s: float) -> None:
    """Let ``tasks`` finish for up to ``grace_s``, then cancel what is left."""
    pending = {task for task in tasks if not task.done()}
    if not pending:
        return
    _, late = await asyncio.wait(pending, timeout=max(grace_s, 0.0))
    await cancel_all(late)


async def keep_cancelling(task: asyncio.Task[Any], *, until: Callable[[], bool], attempts: int = 100) -> None:
    """Repeat ``task.cancel()`` every ``RETRY_S`` until the task ends or ``until()`` is true
    (the task has seen its cancellation and is cleaning up)."""
    for _ in range(attempts):
        await asyncio.sleep(RETRY_S)
        if task.done() or until():
            return
        task.cancel()


def raise_if_cancelled() -> None:
    """Re-raise a cancellation that a library swallowed.

    The task stays marked as cancelling, so check after each call and stop loops that
    were asked to stop.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def uncancel_current() -> None:
    """The current task handled its cancellation: clear every pending request of it."""
    task = asyncio.current_task()
    while task is not None and task.cancelling():
        task.uncancel()


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
            log.error("tasks.failed", task=task.get_name(), error=repr(task.exception()))


class Slots:
    """A bounded number of slots, first come first served. Unlike a semaphore's, a free one
    is taken without awaiting (:meth:`take_now`), so a caller can hold it before its first
    await and nothing that was waiting meanwhile takes it from under it."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    def take_now(self) -> bool:
        if self._free <= 0 or self._waiting:
            return False
        self._free -= 1
        return True

    async def take(self) -> None:
        if not self.take_now():
            handed = asyncio.get_running_loop().create_future()
            self._waiting.append(handed)
            try:
                await handed
            except asyncio.CancelledError:
                if handed.done() and not handed.cancelled():
                    self.give()  # handed a slot just as it was cancelled: pass it on
                else:
                    with contextlib.suppress(ValueError):  # a give() may have dropped it already
                        self._waiting.remove(handed)
                raise

    def give(self) -> None:
        while self._waiting:
            handed = self._waiting.popleft()
            if not handed.done():
                handed.set_result(None)
                return
        self._free += 1

    @property
    def contended(self) -> bool:
        """Someone is waiting for a slot."""
        return bool(self._waiting)
