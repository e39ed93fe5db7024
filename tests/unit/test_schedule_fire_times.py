"""Missed-fire search and the back-off floor on top of APScheduler triggers."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from scheduler.crontab import parse_crontab
from scheduler.schedules import NotBeforeTrigger, effective_trigger, latest_fire_between, next_fire

ANCHOR = datetime(2027, 1, 1, tzinfo=UTC)
HOURLY = IntervalTrigger(hours=1, start_date=ANCHOR, timezone=UTC)


def test_latest_fire_between_for_an_interval() -> None:
    after = ANCHOR + timedelta(minutes=10)
    before = ANCHOR + timedelta(hours=5, minutes=10)
    assert latest_fire_between(HOURLY, after, before) == ANCHOR + timedelta(hours=5)


def test_bounds_are_strict() -> None:
    assert latest_fire_between(HOURLY, ANCHOR + timedelta(hours=5), ANCHOR + timedelta(hours=6)) is None
    assert latest_fire_between(
        HOURLY, ANCHOR + timedelta(hours=4), ANCHOR + timedelta(hours=5, microseconds=1)
    ) == (ANCHOR + timedelta(hours=5))
    assert latest_fire_between(HOURLY, ANCHOR + timedelta(hours=2), ANCHOR + timedelta(hours=1)) is None


def test_latest_fire_between_for_cron_in_a_timezone() -> None:
    trigger = parse_crontab("0 9 * * 1-5").trigger(ZoneInfo("Europe/Berlin"))
    # From Friday evening to Monday 08:00 UTC (09:00 Berlin is 08:00 UTC in winter): Friday 09:00 is
    # before the window, Monday 09:00 is the latest fire.
    after = datetime(2027, 1, 8, 18, tzinfo=UTC)
    assert latest_fire_between(trigger, after, datetime(2027, 1, 11, 8, 30, tzinfo=UTC)) == datetime(
        2027, 1, 11, 8, tzinfo=UTC
    )
    assert latest_fire_between(trigger, after, datetime(2027, 1, 11, 7, 59, tzinfo=UTC)) is None


def test_latest_fire_between_for_a_one_shot() -> None:
    at = DateTrigger(run_date=ANCHOR + timedelta(hours=3), timezone=UTC)
    assert latest_fire_between(at, ANCHOR, ANCHOR + timedelta(days=1)) == ANCHOR + timedelta(hours=3)
    assert latest_fire_between(at, ANCHOR + timedelta(hours=3), ANCHOR + timedelta(days=1)) is None
    assert latest_fire_between(at, ANCHOR, ANCHOR + timedelta(hours=2)) is None


def test_a_year_of_minutely_fires_is_searched_quickly() -> None:
    trigger = parse_crontab("* * * * *").trigger(ZoneInfo("UTC"))
    started = time.perf_counter()
    found = latest_fire_between(trigger, ANCHOR, ANCHOR + timedelta(days=365, seconds=30))
    assert found == ANCHOR + timedelta(days=365)
    assert time.perf_counter() - started < 5  # generous: a linear walk would take minutes


def test_not_before_keeps_the_grid_and_skips_earlier_fires() -> None:
    floor = ANCHOR + timedelta(hours=2, minutes=20)
    trigger = NotBeforeTrigger(HOURLY, floor)
    now = ANCHOR + timedelta(hours=1, minutes=5)
    first = trigger.get_next_fire_time(None, now)
    assert first == ANCHOR + timedelta(hours=3)
    assert trigger.get_next_fire_time(first, first) == ANCHOR + timedelta(hours=4)
    # A previous fire before the floor (as APScheduler passes it) still lands on the grid after it.
    assert trigger.get_next_fire_time(ANCHOR + timedelta(hours=1), now) == ANCHOR + timedelta(hours=3)


def test_effective_trigger() -> None:
    floor = ANCHOR + timedelta(minutes=30)
    assert effective_trigger(HOURLY, one_shot=False, not_before=None) is HOURLY
    retry = effective_trigger(DateTrigger(run_date=ANCHOR, timezone=UTC), one_shot=True, not_before=floor)
    assert retry.get_next_fire_time(None, ANCHOR) == floor
    assert isinstance(effective_trigger(HOURLY, one_shot=False, not_before=floor), NotBeforeTrigger)


def test_next_fire_ignores_a_past_one_shot() -> None:
    at = DateTrigger(run_date=ANCHOR, timezone=UTC)
    assert next_fire(at, ANCHOR + timedelta(seconds=1)) is None
    assert next_fire(at, ANCHOR - timedelta(seconds=1)) == ANCHOR
    assert next_fire(HOURLY, ANCHOR + timedelta(minutes=1)) == ANCHOR + timedelta(hours=1)
