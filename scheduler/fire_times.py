"""Fire-time arithmetic on APScheduler triggers: back-off floors and missed fires.

APScheduler only answers "what is the next fire after X"; catch-up after downtime
needs "what was the latest fire before now that never ran", and back-off needs
"the next fire, but not before T". Both are built here on top of any trigger.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.date import DateTrigger

from scheduler.crontab import CrontabTrigger

_TICK = timedelta(microseconds=1)
_MAX_STEPS = 100_000


class NotBeforeTrigger(BaseTrigger):
    """``base``'s fire times, skipping any earlier than ``not_before`` (failure back-off)."""

    __slots__ = ("base", "not_before")

    def __init__(self, base: BaseTrigger, not_before: datetime) -> None:
        self.base = base
        self.not_before = not_before

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        if previous_fire_time is not None and previous_fire_time >= self.not_before:
            return self.base.get_next_fire_time(previous_fire_time, now)
        # Asking afresh from max(now, not_before) keeps interval anchors and cron fields intact.
        fire: datetime | None = self.base.get_next_fire_time(None, max(now, self.not_before))
        if fire is not None and previous_fire_time is not None and fire <= previous_fire_time:
            return None
        return fire

    def __str__(self) -> str:
        return f"{self.base} not before {self.not_before.isoformat()}"


def effective_trigger(base: BaseTrigger, *, one_shot: bool, not_before: datetime | None) -> BaseTrigger:
    """The trigger to schedule: a failed one-shot retries at ``not_before``; others skip until then.

    Back-off only ever delays: a one-shot never runs before its own time.
    """
    if not_before is None:
        return base
    if one_shot:
        if isinstance(base, DateTrigger):
            not_before = max(not_before, base.run_date)
        return DateTrigger(run_date=not_before, timezone=not_before.tzinfo)
    return NotBeforeTrigger(base, not_before)


def next_fire(trigger: BaseTrigger, now: datetime) -> datetime | None:
    """The first fire at or after ``now`` (None when the trigger is finished or in the past)."""
    fire: datetime | None = trigger.get_next_fire_time(None, now)
    if fire is not None and fire < now:
        return None
    return fire


def latest_fire_between(trigger: BaseTrigger, after: datetime, before: datetime) -> datetime | None:
    """The latest fire time ``t`` with ``after < t < before``, or None.

    Searches back from ``before`` in doubling windows, so a long gap costs a few
    dozen trigger calls rather than one per missed fire.
    """
    if before <= after:
        return None
    if isinstance(trigger, CrontabTrigger):
        return trigger.latest_fire_between(after, before)
    window = timedelta(minutes=1)
    while True:
        start = max(before - window, after + _TICK)
        first: datetime | None = trigger.get_next_fire_time(None, start)
        if first is None or first <= after:
            return None
        if first < before:
            return _last_before(trigger, first, before)
        if start <= after + _TICK:
            return None
        window *= 2


def _last_before(trigger: BaseTrigger, first: datetime, before: datetime) -> datetime:
    current = first
    for _ in range(_MAX_STEPS):
        following: datetime | None = trigger.get_next_fire_time(current, current)
        if following is None or following >= before or following <= current:
            return current
        current = following
    return current
