"""An APScheduler executor that tells the job *when* it was scheduled to fire.

APScheduler 3 calls a job function without its scheduled run time, but a fire
claim must be keyed by exactly that time. This executor (a custom executor, the
extension point APScheduler documents) runs the job's coroutine function as a
task in the scheduler's loop with ``fire_time=<the scheduled time>`` added; with
``coalesce=True`` that is the latest due time. Misfire handling is left to the
job (the scheduler service applies ``scheduler.catch_up``).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from apscheduler.executors.base import BaseExecutor


class FireTimeExecutor(BaseExecutor):
    """Runs coroutine jobs as tasks, passing the scheduled time as ``fire_time``."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, scheduler: Any, alias: str) -> None:
        super().start(scheduler, alias)
        self._loop = asyncio.get_running_loop()

    def shutdown(self, wait: bool = True) -> None:
        # The scheduler service drains or cancels the tasks itself (it can await; this cannot).
        return None

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        assert self._loop is not None, "executor not started"
        fire_time = run_times[-1]
        task = self._loop.create_task(job.func(*job.args, fire_time=fire_time, **job.kwargs))
        self.tasks.add(task)
        job_id = job.id

        def done(finished: asyncio.Task[Any]) -> None:
            self.tasks.discard(finished)
            if finished.cancelled() or finished.exception() is None:
                self._run_job_success(job_id, [])
            else:
                error = finished.exception()
                self._run_job_error(job_id, error, error.__traceback__ if error else None)

        task.add_done_callback(done)
