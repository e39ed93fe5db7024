"""Errors of the cron side, each phrased for the person who caused it."""

from __future__ import annotations


class CronError(Exception):
    """Base class: the message is ready to show on the CLI or to the model."""


class JobNotFoundError(CronError, KeyError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"no cron job with id {job_id!r}")
        self.job_id = job_id

    def __str__(self) -> str:
        return str(self.args[0])


class DuplicateJobError(CronError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"a cron job with id {job_id!r} already exists")
        self.job_id = job_id


class CorruptJobError(CronError):
    """A stored job no longer parses (hand-edited or from an incompatible version)."""


class NotYourJobError(CronError):
    """A chat tried to change a job that belongs to another chat."""


class InvalidJobError(CronError):
    """A job definition (id, prompt, target, allow) that cannot be stored."""


class SchedulerNotRunningError(CronError):
    """A request that only a running daemon can serve, made while none listens."""
