"""Crontab translation: weekday numbering, names, lists/ranges/steps, dom|dow, DST."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger

from scheduler.crontab import parse_crontab

BERLIN = ZoneInfo("Europe/Berlin")
# Wednesday.
START = datetime(2027, 3, 17, 12, 0, tzinfo=UTC)


def fires(trigger: BaseTrigger, start: datetime, count: int) -> list[datetime]:
    out: list[datetime] = []
    previous = None
    now = start
    for _ in range(count):
        fire = trigger.get_next_fire_time(previous, now)
        assert fire is not None
        out.append(fire)
        previous = now = fire
    return out


def weekdays(expr: str, count: int = 7, tz: ZoneInfo | None = None) -> list[str]:
    trigger = parse_crontab(expr).trigger(tz or ZoneInfo("UTC"))
    return [f.strftime("%a") for f in fires(trigger, START, count)]


@pytest.mark.parametrize("expr", ["0 9 * * 0", "0 9 * * 7", "0 9 * * sun", "0 9 * * SUN"])
def test_zero_and_seven_and_name_are_sunday(expr: str) -> None:
    assert weekdays(expr, 3) == ["Sun", "Sun", "Sun"]


def test_apscheduler_from_crontab_numbers_weekdays_differently() -> None:
    # The reason for the translation: APScheduler's own parser reads 0 as Monday.
    theirs = CronTrigger.from_crontab("0 9 * * 0", timezone=UTC).get_next_fire_time(None, START)
    ours = parse_crontab("0 9 * * 0").trigger(ZoneInfo("UTC")).get_next_fire_time(None, START)
    assert theirs is not None and ours is not None
    assert theirs.strftime("%a") == "Mon"
    assert ours.strftime("%a") == "Sun"


def test_ranges_lists_steps_and_names() -> None:
    assert weekdays("0 9 * * 1-5") == ["Thu", "Fri", "Mon", "Tue", "Wed", "Thu", "Fri"]
    assert weekdays("0 9 * * mon-fri", 5) == ["Thu", "Fri", "Mon", "Tue", "Wed"]
    assert weekdays("0 9 * * 1,3,5", 4) == ["Fri", "Mon", "Wed", "Fri"]
    assert weekdays("0 9 * * MON,wed", 3) == ["Mon", "Wed", "Mon"]
    assert weekdays("0 9 * * 5-7", 4) == ["Fri", "Sat", "Sun", "Fri"]
    assert weekdays("0 9 * * fri-sun", 4) == ["Fri", "Sat", "Sun", "Fri"]
    assert weekdays("0 9 * * */2", 5) == ["Thu", "Sat", "Sun", "Tue", "Thu"]
    assert weekdays("0 9 * * 0-7", 7) == ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"]


def test_minute_hour_and_month_fields() -> None:
    every_quarter = fires(parse_crontab("*/15 * * * *").trigger(ZoneInfo("UTC")), START, 4)
    assert [f.minute for f in every_quarter] == [0, 15, 30, 45]  # 12:00 itself is a match
    work_hours = fires(parse_crontab("0 9-17/4 * * *").trigger(ZoneInfo("UTC")), START, 4)
    assert [f.hour for f in work_hours] == [13, 17, 9, 13]
    quarterly = fires(parse_crontab("0 0 1 jan,apr,jul,oct *").trigger(ZoneInfo("UTC")), START, 3)
    assert [(f.month, f.day) for f in quarterly] == [(4, 1), (7, 1), (10, 1)]
    assert [f.minute for f in fires(parse_crontab("5/20 * * * *").trigger(ZoneInfo("UTC")), START, 3)] == [
        5,
        25,
        45,
    ]


def test_day_of_month_or_day_of_week_when_both_restricted() -> None:
    # Classic cron: the 13th of every month OR every Friday.
    got = fires(parse_crontab("0 0 13 * 5").trigger(ZoneInfo("UTC")), START, 4)
    assert [(f.day, f.strftime("%a")) for f in got] == [(19, "Fri"), (26, "Fri"), (2, "Fri"), (9, "Fri")]
    days = [f.day for f in fires(parse_crontab("0 0 13 * 5").trigger(ZoneInfo("UTC")), START, 8)]
    assert 13 in days
    # With one of them a star, only the other restricts.
    assert {f.day for f in fires(parse_crontab("0 0 13 * *").trigger(ZoneInfo("UTC")), START, 3)} == {13}


def test_macros() -> None:
    assert parse_crontab("@daily").expression == "0 0 * * *"
    assert parse_crontab("@weekly").weekdays == (0,)
    assert parse_crontab("@hourly").minutes == (0,)


def test_nine_oclock_berlin_across_the_march_2027_change() -> None:
    trigger = parse_crontab("0 9 * * *").trigger(BERLIN)
    got = fires(trigger, datetime(2027, 3, 26, 12, tzinfo=UTC), 3)
    assert [f.astimezone(BERLIN).strftime("%d %H:%M") for f in got] == ["27 09:00", "28 09:00", "29 09:00"]
    # ...which is 08:00 UTC before the change and 07:00 UTC after it.
    assert [f.astimezone(UTC).hour for f in got] == [8, 7, 7]
    assert got[1].astimezone(UTC) - got[0].astimezone(UTC) == timedelta(hours=23)


def test_nine_oclock_berlin_across_the_october_2027_change() -> None:
    got = fires(parse_crontab("0 9 * * *").trigger(BERLIN), datetime(2027, 10, 29, 12, tzinfo=UTC), 3)
    assert [f.astimezone(BERLIN).strftime("%d %H:%M") for f in got] == ["30 09:00", "31 09:00", "01 09:00"]
    assert got[1].astimezone(UTC) - got[0].astimezone(UTC) == timedelta(hours=25)


def test_repeated_hour_fires_once_for_fixed_hour_jobs_but_hourly_jobs_keep_both() -> None:
    start = datetime(2027, 10, 30, 12, tzinfo=UTC)
    daily = fires(parse_crontab("30 2 * * *").trigger(BERLIN), start, 2)
    assert [f.astimezone(UTC).strftime("%d %H:%M") for f in daily] == ["31 00:30", "01 01:30"]
    hourly = fires(parse_crontab("30 * * * *").trigger(BERLIN), datetime(2027, 10, 30, 23, 45, tzinfo=UTC), 3)
    assert [f.astimezone(UTC).strftime("%H:%M") for f in hourly] == ["00:30", "01:30", "02:30"]
    spring = fires(parse_crontab("30 * * * *").trigger(BERLIN), datetime(2027, 3, 28, 0, 15, tzinfo=UTC), 3)
    assert [f.astimezone(BERLIN).strftime("%H:%M") for f in spring] == ["01:30", "03:30", "04:30"]
    assert [f.astimezone(BERLIN).strftime("%H:%M") for f in hourly] == ["02:30", "02:30", "03:30"]


def test_fixed_time_in_the_spring_gap_runs_once_at_the_jump() -> None:
    got = fires(parse_crontab("15,45 2 * * *").trigger(BERLIN), datetime(2027, 3, 27, 12, tzinfo=UTC), 3)
    # 02:15 and 02:45 do not exist on the 28th: one fire when the clocks jump to 03:00 CEST.
    assert got[0].astimezone(UTC).strftime("%d %H:%M") == "28 01:00"
    assert [f.astimezone(BERLIN).strftime("%d %H:%M") for f in got] == ["28 03:00", "29 02:15", "29 02:45"]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "empty expression"),
        ("* * * *", "expected 5 fields .* got 4"),
        ("* * * * * *", "got 6"),
        ("60 * * * *", "minute value 60 .* out of range 0-59"),
        ("* 24 * * *", "hour value 24"),
        ("* * 0 * *", "day-of-month value 0"),
        ("* * * 13 *", "month value 13"),
        ("* * * * 8", "day-of-week value 8 .* out of range 0-7"),
        ("* * * * funday", "day-of-week value 'funday' .* not a number .*names: sun, mon"),
        ("* * * smarch *", "month value 'smarch'"),
        ("*/0 * * * *", "minute step .* must be a positive number"),
        ("*/x * * * *", "minute step"),
        ("5-1 * * * *", "runs backwards"),
        ("1,,2 * * * *", "empty list element"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6 *", "never fires"),
        ("@reboot", "unknown macro '@reboot'"),
        ("0 9 * * L", "day-of-week value 'L'"),
        ("\u0663 * * * *", "minute value .* not a number"),
        ("00000000005 * * * *", "minute value .* not a number"),
    ],
)
def test_bad_expressions_name_the_field(expr: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_crontab(expr)


def test_february_29th_is_possible() -> None:
    got = fires(parse_crontab("0 0 29 2 *").trigger(ZoneInfo("UTC")), START, 1)
    assert (got[0].year, got[0].month, got[0].day) == (2028, 2, 29)
