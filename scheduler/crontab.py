"""Standard 5-field cron expressions, translated faithfully to APScheduler triggers.

``minute hour day-of-month month day-of-week`` with ``*``, lists, ranges and steps,
month names (jan-dec), weekday names (sun-sat) and weekday numbers in the crontab
sense: 0 and 7 are Sunday, 1 is Monday. APScheduler numbers weekdays from Monday
(``CronTrigger.from_crontab`` and its ``day_of_week`` field use 0 = Monday), so
every field is expanded here to explicit values and weekdays are handed over as
names, never as numbers. Two more crontab rules are kept:

* when both day-of-month and day-of-week are restricted (neither starts with
  ``*``) the job runs when *either* matches (APScheduler alone would require both);
* when clocks fall back, a time inside the repeated hour fires once, not twice,
  for jobs with a fixed hour. In the spring-forward gap a job runs at the UTC
  instant its wall time would have had (02:30 in a skipped hour runs at 03:30).

Also accepted: ``@yearly``/``@annually``, ``@monthly``, ``@weekly``, ``@daily``/
``@midnight``, ``@hourly``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger

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
# Crontab weekday numbers: index 0 = Sunday; these names are also what APScheduler accepts.
WEEKDAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_MAX_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


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
    hours_restricted: bool

    def trigger(self, timezone: ZoneInfo) -> BaseTrigger:
        """The APScheduler trigger firing exactly when this expression matches in ``timezone``."""
        common: dict[str, Any] = {
            "minute": _join(self.minutes, 0, 59),
            "hour": _join(self.hours, 0, 23),
            "month": _join(self.months, 1, 12),
            "timezone": timezone,
        }
        day = _join(self.days, 1, 31)
        weekday = "*" if len(self.weekdays) == 7 else ",".join(WEEKDAY_NAMES[d] for d in self.weekdays)
        common["once_in_repeated_hour"] = self.hours_restricted
        if self.days_restricted and self.weekdays_restricted:
            return OrTrigger(
                [
                    WallClockCronTrigger(day=day, day_of_week="*", **common),
                    WallClockCronTrigger(day="*", day_of_week=weekday, **common),
                ]
            )
        return WallClockCronTrigger(day=day, day_of_week=weekday, **common)


class WallClockCronTrigger(CronTrigger):
    """A CronTrigger with crontab's DST manners.

    Fire times come back normalized (a wall time inside a spring-forward gap is
    shown as the real instant), and with ``once_in_repeated_hour`` a wall time
    that occurs twice when clocks fall back fires only the first time.
    """

    def __init__(self, *, once_in_repeated_hour: bool = False, **fields: Any) -> None:
        super().__init__(**fields)
        self.once_in_repeated_hour = once_in_repeated_hour

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        fire: datetime | None = super().get_next_fire_time(previous_fire_time, now)
        for _ in range(8):
            if fire is None:
                return None
            fire = datetime.fromtimestamp(fire.timestamp(), fire.tzinfo)
            if not (self.once_in_repeated_hour and _second_occurrence(fire)):
                break
            fire = super().get_next_fire_time(fire, fire)
        return fire


def _second_occurrence(local: datetime) -> bool:
    return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()


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
    weekdays = tuple(sorted({d % 7 for d in values[4]}))
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
        weekdays=weekdays,
        days_restricted=days_restricted,
        weekdays_restricted=weekdays_restricted,
        hours_restricted=not parts[1].startswith("*"),
    )


def _parse_field(text: str, spec: _Field) -> tuple[int, ...]:
    found: set[int] = set()
    for element in text.split(","):
        if not element:
            raise ValueError(f"cron: {spec.label} field {text!r} has an empty list element")
        found.update(_parse_element(element, spec))
    return tuple(sorted(found))


def _parse_element(element: str, spec: _Field) -> range:
    base, _, step_text = element.partition("/")
    step = 1
    if _:
        if not step_text.isdigit() or int(step_text) == 0:
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
        high = spec.high if _ else low
    return range(low, high + 1, step)


def _value(text: str, spec: _Field, element: str) -> int:
    lowered = text.lower()
    if lowered in spec.names:
        return spec.names[lowered]
    if not text.isdigit():
        hint = f" (names: {', '.join(spec.names)})" if spec.names else ""
        raise ValueError(f"cron: {spec.label} value {text!r} in {element!r} is not a number{hint}")
    number = int(text)
    if not spec.low <= number <= spec.high:
        raise ValueError(
            f"cron: {spec.label} value {number} in {element!r} is out of range {spec.low}-{spec.high}"
        )
    return number


def _join(values: tuple[int, ...], low: int, high: int) -> str:
    return "*" if len(values) == high - low + 1 else ",".join(str(v) for v in values)
