"""Cron fire times against a brute-force crontab(5) reference, around every kind of offset change.

The reference knows nothing of the implementation's day arithmetic: it walks UTC
minutes, reads each one on the zone's wall clock and applies the rules of
DESIGN.md §7.3 directly (fields, the day-of-month/day-of-week OR rule, first pass
only for fixed-time jobs, fixed-time matches skipped by a spring-forward jump run
at the jump). The scheduler's forward chain, its catch-up search and
``botd cron next`` must all agree with it, for seeded random expressions and the
edge families (gaps, repeated hours, the days and months after a change, Feb 29,
the 31st, weekday 7, macros) in six zones.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest

from scheduler.cron_commands import NextQuery, inline_next
from scheduler.crontab import MACROS, Crontab, parse_crontab
from scheduler.schedules import latest_fire_between

MINUTE = timedelta(minutes=1)

# (zone, first local day, number of days): each window holds an offset change or a boundary.
SHORT_WINDOWS = [
    ("Europe/Berlin", date(2025, 3, 29), 3),  # spring gap 02:00-03:00 on the 30th
    ("Europe/Berlin", date(2025, 10, 25), 3),  # 02:00-03:00 repeated on the 26th
    ("America/New_York", date(2025, 3, 8), 3),
    ("America/New_York", date(2027, 11, 6), 3),  # 01:00-02:00 repeated on the 7th
    ("Australia/Lord_Howe", date(2025, 4, 5), 3),  # 30-minute fall back: 01:30-02:00 twice
    ("Australia/Lord_Howe", date(2025, 10, 4), 3),  # 30-minute gap 02:00-02:30
    ("Asia/Kathmandu", date(2025, 12, 30), 3),  # +05:45, a year boundary
    ("America/Santiago", date(2025, 9, 5), 4),  # midnight does not exist on the 7th
    ("America/Santiago", date(2025, 4, 4), 4),  # 23:00-24:00 on the 5th happens twice
    ("UTC", date(2028, 2, 27), 4),  # Feb 29
]
LONG_WINDOWS = [
    ("Europe/Berlin", date(2025, 3, 1), 46),
    ("Europe/Berlin", date(2028, 2, 20), 20),
    ("America/New_York", date(2025, 10, 25), 40),
    ("Australia/Lord_Howe", date(2025, 12, 20), 20),
    ("Asia/Kathmandu", date(2025, 12, 25), 40),
    ("America/Santiago", date(2025, 8, 25), 45),
    ("UTC", date(2028, 1, 25), 40),
]
EDGE_FAMILIES = [
    "0 0 * * *", "0 2 * * *", "30 2 * * *", "15,45 2 * * *", "* 2 * * *", "*/15 * * * *",
    "15 * * * *", "0 * * * *", "30 1 * * *", "45 1 * * *", "* 1 * * *", "0 23 * * *", "30 23 * * *",
    "59 23 * * *", "0 0 1 * *", "0 0 1 1 *", "0 0 29 2 *", "0 0 31 * *", "0 12 31 1,3 *",
    "0 12 * * 7", "0 0 * * 0", "0 0 * * 6,7", "0 0 13 * 5", "0 0 1 * 1", "0 9 * * 1-5",
    "*/7 0-3 * * *", "0 */2 * * *", "5 0 * * *", "0 0,1 * * *", "* * * * *",
    "@daily", "@midnight", "@hourly", "@weekly", "@monthly", "@yearly", "@annually",
]


@dataclass(frozen=True)
class Minute:
    at: datetime  # UTC
    wall: datetime  # naive local wall time
    second_pass: bool  # a repeated wall time, seen for the second time
    skipped: tuple[datetime, ...]  # wall times the clock jumped over just before this minute


@cache
def walk(zone_name: str, first_day: date, days: int) -> tuple[Minute, ...]:
    """Every UTC minute whose wall time lies in the window, read on the zone's clock."""
    zone = ZoneInfo(zone_name)
    start = datetime(first_day.year, first_day.month, first_day.day, tzinfo=zone).astimezone(UTC)
    end_day = first_day + timedelta(days=days)
    end = datetime(end_day.year, end_day.month, end_day.day, tzinfo=zone).astimezone(UTC)
    at = start - timedelta(hours=3)
    previous = at.astimezone(zone).replace(tzinfo=None)
    out: list[Minute] = []
    while at < end + timedelta(hours=3):
        local = at.astimezone(zone)
        wall = local.replace(tzinfo=None, fold=0)
        skipped: list[datetime] = []
        step = previous + MINUTE
        while step < wall:
            skipped.append(step)
            step += MINUTE
        if start <= at < end:
            out.append(Minute(at, wall, local.fold == 1, tuple(skipped)))
        previous, at = wall, at + MINUTE
    return tuple(out)


class Reference:
    """crontab(5) rules applied minute by minute; independent of scheduler.crontab's arithmetic."""

    def __init__(self, expression: str) -> None:
        text = MACROS.get(expression.lower(), expression)
        fields = text.split()
        parsed: Crontab = parse_crontab(text)  # field values only; the rules are applied here
        self.minutes, self.hours = set(parsed.minutes), set(parsed.hours)
        self.days, self.months = set(parsed.days), set(parsed.months)
        self.weekdays = {d % 7 for d in parsed.weekdays}
        self.either_day = not fields[2].startswith("*") and not fields[4].startswith("*")
        self.wildcard = fields[0].startswith("*") or fields[1].startswith("*")

    def matches(self, wall: datetime) -> bool:
        if wall.minute not in self.minutes or wall.hour not in self.hours or wall.month not in self.months:
            return False
        by_day, by_weekday = wall.day in self.days, wall.isoweekday() % 7 in self.weekdays
        return (by_day or by_weekday) if self.either_day else (by_day and by_weekday)

    def fires(self, minutes: tuple[Minute, ...]) -> list[datetime]:
        out = []
        for minute in minutes:
            if self.matches(minute.wall) and (self.wildcard or not minute.second_pass):
                out.append(minute.at)
            elif not self.wildcard and any(self.matches(w) for w in minute.skipped):
                out.append(minute.at)  # a fixed time the clocks jumped over runs at the jump
        return out


def chain(expression: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    trigger = parse_crontab(expression).trigger(ZoneInfo(zone))
    out: list[datetime] = []
    fire = trigger.get_next_fire_time(None, start)
    while fire is not None and fire < end:
        assert not out or fire > out[-1]
        out.append(fire.astimezone(UTC))
        fire = trigger.get_next_fire_time(fire, fire)
    return out


def check(expression: str, zone: str, window: tuple[date, int], rng: random.Random, probes: int = 4) -> None:
    minutes = walk(zone, *window)
    start, end = minutes[0].at, minutes[-1].at + MINUTE
    expected = Reference(expression).fires(minutes)
    label = f"{expression!r} in {zone} from {window[0]}"
    assert chain(expression, zone, start, end) == expected, label
    trigger = parse_crontab(expression).trigger(ZoneInfo(zone))
    span = int((end - start).total_seconds())
    for _ in range(probes):
        a, b = sorted(start + timedelta(seconds=rng.randrange(span)) for _ in range(2))
        if rng.random() < 0.3 and expected:
            a = rng.choice(expected)  # exact fire instants are the delicate bounds
        if rng.random() < 0.3 and expected:
            b = rng.choice(expected)
        inside = [f for f in expected if a < f < b]
        assert latest_fire_between(trigger, a, b) == (inside[-1] if inside else None), f"{label} ({a}, {b})"
    after = start + timedelta(seconds=rng.randrange(span))
    answer = inline_next(NextQuery(cron=expression, tz=zone, after=after.isoformat(), count=3))
    want = [f for f in expected if f >= after][:3]
    assert [f for f in answer.fires if f < end] == want, f"cron next {label} after {after}"


def random_field(rng: random.Random, low: int, high: int, names: tuple[str, ...] = ()) -> str:
    def value() -> str:
        number = rng.randint(low, high)
        if names and rng.random() < 0.3:
            return names[(number - low) % len(names)]
        return str(number)

    roll = rng.random()
    if roll < 0.3:
        return "*"
    if roll < 0.4:
        return f"*/{rng.randint(2, max(2, (high - low) // 2))}"
    if roll < 0.6:
        return value()
    if roll < 0.8:
        return ",".join(sorted({value() for _ in range(rng.randint(2, 4))}))
    a, b = sorted(rng.sample(range(low, high + 1), 2))
    return f"{a}-{b}" + (f"/{rng.randint(2, 4)}" if rng.random() < 0.4 else "")


def random_expression(rng: random.Random) -> str:
    months = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
    while True:
        fields = [
            random_field(rng, 0, 59),
            random_field(rng, 0, 23) if rng.random() < 0.7 else rng.choice(["0", "1", "2", "23", "0,2"]),
            "*" if rng.random() < 0.6 else random_field(rng, 1, 31),
            "*" if rng.random() < 0.7 else random_field(rng, 1, 12, months),
            "*" if rng.random() < 0.5 else random_field(rng, 0, 7, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")),
        ]
        expression = " ".join(fields)
        try:
            parse_crontab(expression)
        except ValueError:
            continue
        return expression


@pytest.mark.parametrize(("zone", "first_day", "days"), SHORT_WINDOWS)
def test_edge_families_match_the_reference(zone: str, first_day: date, days: int) -> None:
    rng = random.Random(f"{zone}{first_day}")
    for expression in EDGE_FAMILIES:
        check(expression, zone, (first_day, days), rng)


@pytest.mark.parametrize(("zone", "first_day", "days"), LONG_WINDOWS)
def test_days_and_months_after_a_change_are_never_skipped(zone: str, first_day: date, days: int) -> None:
    # Weeks long, so only the expressions that fire at most once an hour (the dense ones
    # repeat the same day pattern, which the short windows already cover).
    rng = random.Random(f"{zone}{first_day}")
    for expression in EDGE_FAMILIES:
        parsed = parse_crontab(expression)
        if len(parsed.minutes) * len(parsed.hours) <= 24:
            check(expression, zone, (first_day, days), rng)


def run_random(seeds: range) -> None:
    for seed in seeds:
        rng = random.Random(seed)
        expression = random_expression(rng)
        zone, first_day, days = SHORT_WINDOWS[seed % len(SHORT_WINDOWS)]
        check(expression, zone, (first_day, days), rng)


def test_random_expressions_match_the_reference() -> None:
    run_random(range(250))


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_many_random_expressions_match_the_reference() -> None:
    run_random(range(250, 10_250))
