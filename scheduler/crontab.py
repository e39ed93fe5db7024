"""Cron semantics: crontab(5) expressions and their fire instants in an IANA zone.

``minute hour day-of-month month day-of-week`` with ``*``, lists, ranges, steps,
month names (jan-dec) and weekday names (sun-sat), read as cronie reads them:

* weekday numbers 0 and 7 are Sunday;
* when both day-of-month and day-of-week are restricted (neither starts with
  ``*``) a day matches if *either* matches; otherwise both must match;
* a *fixed-time* job (neither the minute nor the hour field starts with ``*``)
  whose wall time falls in a spring-forward gap runs once, at the jump; in a
  fall-back hour it runs once, on the first pass;
* a *wildcard* job (minute or hour field starts with ``*``) runs at every
  wall-clock time that exists: not in a gap, on both passes of a repeated hour;
* an offset change never skips a day or a month: days are local calendar days.

Fire instants are computed here, day by day in the job's zone, never by
APScheduler's CronTrigger (which skips days after offset changes);
:class:`CrontabTrigger` hands them to APScheduler. The forward chain
(:meth:`Crontab.next_fire`) and the backward search (:meth:`Crontab.previous_fire`)
enumerate the same per-day sets, so catch-up always agrees with the fires.

Also accepted: ``@yearly``/``@annually``, ``@monthly``, ``@weekly``, ``@daily``/
``@midnight``, ``@hourly``.
"""

from __future__ import annotations

import calendar
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from apscheduler.triggers.base import BaseTrigger

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")  # crontab numbering: 0 = Sunday
_MAX_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_DAY = timedelta(days=1)
# Every valid expression fires within one 400-year Gregorian cycle.
_HORIZON_MONTHS = 12 * 401
# Days are searched in these years only, so no date or instant arithmetic can overflow.
_FIRST_YEAR, _LAST_YEAR = 2, 9998


@dataclass(frozen=True)
class _Field:
    label: str
    low: int
    high: int
    names: dict[str, int]


_FIELDS = (
    _Field("minute", 0, 59, {}),
    _Field("hour", 0, 23, {}),
    _Field("day-of-month", 1, 31, {}),
    _Field("month", 1, 12, {n: i + 1 for i, n in enumerate(MONTH_NAMES)}),
    _Field("day-of-week", 0, 7, {n: i for i, n in enumerate(WEEKDAY_NAMES)}),
)


@dataclass(frozen=True)
class WallTime:
    """Where a local wall time lands: ``first`` instant, ``second`` on a repeated hour.

    ``skipped`` wall times (in a spring-forward gap) land on the jump: ``first`` is
    the instant the clocks changed.
    """

    first: datetime
    second: datetime | None = None
    skipped: bool = False


def wall_time(local: datetime, zone: ZoneInfo) -> WallTime:
    """Resolve a naive wall-clock time in ``zone`` to UTC instants."""
    naive = local.replace(tzinfo=None, fold=0)
    early = naive.replace(tzinfo=zone).astimezone(UTC)
    late = naive.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if early == late:
        return WallTime(early)
    if early < late:
        return WallTime(early, late)
    return WallTime(_transition(late, early, zone), skipped=True)


def _transition(before: datetime, after: datetime, zone: ZoneInfo) -> datetime:
    """The first instant in ``(before, after]`` that has ``after``'s offset (binary search)."""
    target = after.astimezone(zone).utcoffset()
    low, high = int(before.timestamp()), int(after.timestamp())
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, zone).utcoffset() == target:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)


@dataclass(frozen=True)
class Crontab:
    """A parsed expression: the explicit values of each field (weekdays 0 = Sunday)."""

    expression: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]
    days_restricted: bool
    weekdays_restricted: bool
    wildcard_time: bool
    _times: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Minutes of the day this expression fires at, sorted: the fast path bisects them.
        object.__setattr__(self, "_times", tuple(h * 60 + m for h in self.hours for m in self.minutes))

    def trigger(self, timezone: ZoneInfo) -> CrontabTrigger:
        """The APScheduler trigger firing at this expression's instants in ``timezone``."""
        return CrontabTrigger(self, timezone)

    def day_in_month(self, day: int, weekday: int) -> bool:
        """Whether day ``day`` of a month, a ``weekday`` (0 = Sunday), matches the day fields."""
        in_days, in_weekdays = day in self.days, weekday in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_days or in_weekdays
        return in_days and in_weekdays

    def next_fire(self, moment: datetime, zone: ZoneInfo, *, inclusive: bool = False) -> datetime | None:
        """The first fire after ``moment`` (or at it, with ``inclusive``); None past the horizon."""
        found: datetime | None = None
        found_day = date.min
        for day in self._days(_local_date(moment, zone, -1), forward=True):
            if found is not None and day > found_day + _DAY:
                break  # only neighbouring days can interleave (a change around midnight)
            fire = self._first_on(day, zone, moment, inclusive)
            if fire is not None and (found is None or fire < found):
                found, found_day = fire, day
        return found

    def previous_fire(self, moment: datetime, zone: ZoneInfo) -> datetime | None:
        """The last fire strictly before ``moment``; None past the horizon."""
        found: datetime | None = None
        found_day = date.max
        for day in self._days(_local_date(moment, zone, 1), forward=False):
            if found is not None and day < found_day - _DAY:
                break
            fire = self._last_on(day, zone, moment)
            if fire is not None and (found is None or fire > found):
                found, found_day = fire, day
        return found

    def _first_on(self, day: date, zone: ZoneInfo, moment: datetime, inclusive: bool) -> datetime | None:
        offset = _steady_offset(day, zone)
        if offset is None:
            return next((f for f in self.fires_on(day, zone) if f > moment or (inclusive and f == moment)), None)
        minute, rest = _wall_minute(day, offset, moment)
        index = bisect_left(self._times, minute) if inclusive and not rest else bisect_right(self._times, minute)
        return self._instant(day, offset, index)

    def _last_on(self, day: date, zone: ZoneInfo, moment: datetime) -> datetime | None:
        offset = _steady_offset(day, zone)
        if offset is None:
            return next((f for f in reversed(self.fires_on(day, zone)) if f < moment), None)
        minute, rest = _wall_minute(day, offset, moment)
        index = (bisect_right(self._times, minute) if rest else bisect_left(self._times, minute)) - 1
        return self._instant(day, offset, index)

    def _instant(self, day: date, offset: timedelta, index: int) -> datetime | None:
        if not 0 <= index < len(self._times):
            return None
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        return start + timedelta(minutes=self._times[index]) - offset

    def fires_on(self, day: date, zone: ZoneInfo) -> tuple[datetime, ...]:
        """The UTC instants of the fires that belong to local calendar day ``day``, sorted."""
        offset = _steady_offset(day, zone)
        if offset is not None:
            return tuple(f for i in range(len(self._times)) if (f := self._instant(day, offset, i)) is not None)
        return _changing_day_fires(self, day, zone)

    def _days(self, start: date, *, forward: bool) -> Iterator[date]:
        """Matching local days from ``start`` (inclusive), in order, up to the horizon."""
        year, month = start.year, start.month
        for _ in range(_HORIZON_MONTHS):
            if not _FIRST_YEAR <= year <= _LAST_YEAR:
                return  # keeps every date and instant computed here inside datetime's range
            if month in self.months:
                days = _matching_days(self, year, month)
                for d in days if forward else reversed(days):
                    candidate = date(year, month, d)
                    if candidate >= start if forward else candidate <= start:
                        yield candidate
            month += 1 if forward else -1
            if month > 12:
                year, month = year + 1, 1
            elif month < 1:
                year, month = year - 1, 12


@lru_cache(maxsize=1024)
def _matching_days(crontab: Crontab, year: int, month: int) -> tuple[int, ...]:
    """Days of the month that match the day-of-month / day-of-week fields (cached per month)."""
    first_weekday = date(year, month, 1).isoweekday() % 7
    length = calendar.monthrange(year, month)[1]
    return tuple(d for d in range(1, length + 1) if crontab.day_in_month(d, (first_weekday + d - 1) % 7))


@lru_cache(maxsize=512)
def _changing_day_fires(crontab: Crontab, day: date, zone: ZoneInfo) -> tuple[datetime, ...]:
    """Fires on a day whose offset changes: each wall time resolved on its own (cached: rare, slow)."""
    start = datetime(day.year, day.month, day.day)
    fires: set[datetime] = set()
    for hour in crontab.hours:
        for minute in crontab.minutes:
            resolved = wall_time(start.replace(hour=hour, minute=minute), zone)
            if resolved.skipped:
                if not crontab.wildcard_time:
                    fires.add(resolved.first)
                continue
            fires.add(resolved.first)
            if resolved.second is not None and crontab.wildcard_time:
                fires.add(resolved.second)
    return tuple(sorted(fires))


def _local_date(moment: datetime, zone: ZoneInfo, shift_days: int) -> date:
    """The local date of ``moment`` shifted by some days, clamped to the searchable years."""
    local = moment.astimezone(UTC).replace(tzinfo=None)  # never overflows: moment is in range
    year = min(max(local.year, _FIRST_YEAR), _LAST_YEAR)
    if year != local.year:
        return date(year, 1, 1) if year == _FIRST_YEAR else date(year, 12, 31)
    return moment.astimezone(zone).date() + timedelta(days=shift_days)


def _steady_offset(day: date, zone: ZoneInfo) -> timedelta | None:
    """The UTC offset of local day ``day`` when it does not change during the day, else None."""
    start = datetime(day.year, day.month, day.day)
    offset = start.replace(tzinfo=zone).utcoffset()
    if offset is None or offset != (start + _DAY).replace(tzinfo=zone).utcoffset():
        return None
    return offset


def _wall_minute(day: date, offset: timedelta, moment: datetime) -> tuple[int, int]:
    """``moment`` as (whole minutes, remaining microseconds) since local midnight of ``day``."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    elapsed = (moment.astimezone(UTC) - start) + offset  # timedeltas: no overflow near datetime.min
    return divmod(elapsed // timedelta(microseconds=1), 60_000_000)


class CrontabTrigger(BaseTrigger):
    """APScheduler trigger over :class:`Crontab` instants (the scheduler's only cron clock)."""

    __slots__ = ("crontab", "timezone")

    def __init__(self, crontab: Crontab, timezone: ZoneInfo) -> None:
        self.crontab = crontab
        self.timezone = timezone

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        # Same contract as CronTrigger: after the previous fire, else at or after now.
        if previous_fire_time is not None:
            return self.crontab.next_fire(previous_fire_time, self.timezone)
        return self.crontab.next_fire(now, self.timezone, inclusive=True)

    def latest_fire_between(self, after: datetime, before: datetime) -> datetime | None:
        """The latest fire ``t`` with ``after < t < before`` (catch-up after downtime)."""
        fire = self.crontab.previous_fire(before, self.timezone)
        return fire if fire is not None and fire > after else None

    def __str__(self) -> str:
        return f"cron[{self.crontab.expression}] in {self.timezone.key}"

    def __repr__(self) -> str:
        return f"<CrontabTrigger {self.crontab.expression!r} {self.timezone.key}>"


def parse_crontab(expression: str) -> Crontab:
    """Parse a 5-field expression or macro; ValueError names the field and the problem."""
    text = " ".join(str(expression).split())
    if not text:
        raise ValueError(
            "cron: empty expression (expected 5 fields: minute hour day-of-month month day-of-week)"
        )
    if text.startswith("@"):
        if text.lower() not in MACROS:
            known = ", ".join(MACROS)
            raise ValueError(f"cron: unknown macro {text!r} (known: {known})")
        text = MACROS[text.lower()]
    parts = text.split(" ")
    if len(parts) != 5:
        raise ValueError(
            f"cron: expected 5 fields (minute hour day-of-month month day-of-week), got {len(parts)} in {text!r}"
        )
    values = [_parse_field(part, spec) for part, spec in zip(parts, _FIELDS, strict=True)]
    days_restricted = not parts[2].startswith("*")
    weekdays_restricted = not parts[4].startswith("*")
    if not (days_restricted and weekdays_restricted) and not any(
        d <= _MAX_DAYS[m - 1] for d in values[2] for m in values[3]
    ):
        raise ValueError(f"cron: {text!r} never fires (no such day in the chosen months)")
    return Crontab(
        expression=text,
        minutes=values[0],
        hours=values[1],
        days=values[2],
        months=values[3],
        weekdays=tuple(sorted({d % 7 for d in values[4]})),
        days_restricted=days_restricted,
        weekdays_restricted=weekdays_restricted,
        wildcard_time=parts[0].startswith("*") or parts[1].startswith("*"),
    )


def _parse_field(text: str, spec: _Field) -> tuple[int, ...]:
    found: set[int] = set()
    for element in text.split(","):
        if not element:
            raise ValueError(f"cron: {spec.label} field {text!r} has an empty list element")
        found.update(_parse_element(element, spec))
    return tuple(sorted(found))


def _parse_element(element: str, spec: _Field) -> range:
    base, slash, step_text = element.partition("/")
    step = 1
    if slash:
        if not _is_number(step_text) or int(step_text) == 0:
            raise ValueError(f"cron: {spec.label} step in {element!r} must be a positive number")
        step = int(step_text)
    if base == "*":
        low, high = spec.low, spec.high
    elif "-" in base:
        first, _, last = base.partition("-")
        low, high = _value(first, spec, element), _value(last, spec, element)
        if spec.label == "day-of-week" and high == 0 and last.lower() == "sun":
            high = 7  # "fri-sun" ends on Sunday, written 7 in crontab numbering
        if low > high:
            raise ValueError(f"cron: {spec.label} range {element!r} runs backwards (start after end)")
    else:
        low = _value(base, spec, element)
        # "5/15" means from 5 to the end in steps of 15; a bare value is just itself.
        high = spec.high if slash else low
    return range(low, high + 1, step)


def _is_number(text: str) -> bool:
    # ASCII only: str.isdigit() also accepts digits of other scripts and superscripts.
    return text.isascii() and text.isdigit() and len(text) <= 4


def _value(text: str, spec: _Field, element: str) -> int:
    lowered = text.lower()
    if lowered in spec.names:
        return spec.names[lowered]
    if not _is_number(text):
        hint = f" (names: {', '.join(spec.names)})" if spec.names else ""
        raise ValueError(f"cron: {spec.label} value {text!r} in {element!r} is not a number{hint}")
    number = int(text)
    if not spec.low <= number <= spec.high:
        raise ValueError(
            f"cron: {spec.label} value {number} in {element!r} is out of range {spec.low}-{spec.high}"
        )
    return number
