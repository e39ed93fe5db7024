"""When a cron job runs: a one-shot time, a fixed interval, or a crontab expression,
and the times it fires.

Every form is stored as an absolute, replica-independent description so that all
replicas compute the same fire times: ``in 20m`` becomes an ``at`` time when the
job is created, and ``every`` is anchored at the creation time (fires at anchor +
k × interval). ``at`` accepts ISO-8601 with an offset (``Z`` included) or a naive
time, read in the job's timezone. Cron expressions are evaluated in an IANA
timezone (default ``scheduler.timezone``), see :mod:`scheduler.crontab`.

Time as the scheduler sees it: an injectable clock and one UTC text form. Fire
claims and ledger entries are keyed by the *scheduled* time written in that
canonical form, so every replica derives the same key for the same fire. Human
durations read like ``30m``, ``1h30m``, ``2d`` or ``45s``.

``CronError`` is the base of every error of the cron side (schedules here, jobs in
:mod:`scheduler.jobs`); each message is phrased for the person who caused it.

Fire-time arithmetic on APScheduler triggers: APScheduler only answers "what is the
next fire after X"; catch-up after downtime needs "what was the latest fire before now
that never ran", and back-off needs "the next fire, but not before T". Both are built
here on top of any trigger.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger
from pydantic import BaseModel, ConfigDict, Field, field_validator

from scheduler.crontab import CrontabTrigger, parse_crontab, wall_time

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The default clock: an aware UTC datetime."""
    return datetime.now(UTC)


def iso_utc(moment: datetime) -> str:
    """``2027-03-28T07:00:00Z``: second precision, UTC, the form used in Redis keys."""
    if moment.tzinfo is None:
        raise ValueError("a fire time must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso_utc(text: str) -> datetime:
    """Inverse of :func:`iso_utc` (also accepts any ISO-8601 text with an offset)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"timestamp without offset: {text!r}")
    return moment.astimezone(UTC)


_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|m|min|mins|h|hr|hrs|d|w)", re.IGNORECASE)
_UNITS = {
    "ms": 0.001, "s": 1, "sec": 1, "secs": 1, "m": 60, "min": 60, "mins": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "d": 86400, "w": 604800,
}


def parse_duration(text: str) -> float:
    """Seconds in ``text``; raises ValueError with a readable message when it is not a duration."""
    raw = str(text).strip()
    if not raw:
        raise ValueError("empty duration")
    if re.fullmatch(r"\d+(\.\d+)?", raw):
        return float(raw)
    pos, total = 0, 0.0
    compact = raw.replace(" ", "")
    for match in _PART.finditer(compact):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2).lower()]
        pos = match.end()
    if pos != len(compact) or pos == 0:
        raise ValueError(f"not a duration: {raw!r} (use forms like 45s, 20m, 1h30m, 2d)")
    if total <= 0:
        raise ValueError(f"duration must be positive: {raw!r}")
    return total


def format_duration(seconds: float) -> str:
    """The short human form parse_duration reads back: 90 -> ``1m30s``, 3600 -> ``1h``."""
    total = round(float(seconds))
    if total <= 0:
        return f"{float(seconds):g}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, total = divmod(total, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


class CronError(Exception):
    """Base class: the message is ready to show on the CLI or to the model."""


MIN_EVERY_S = 60.0
MAX_EVERY_S = 366 * 86400.0


class ScheduleError(CronError, ValueError):
    """A schedule the user wrote is not valid; the message names the option and the problem."""


def _check_zone(name: str) -> str:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown IANA timezone {name!r} (e.g. Europe/Berlin, UTC)") from exc
    return name


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("must carry a timezone")
    return value


class AtSchedule(BaseModel):
    """Once, at ``at``; ``tz`` only affects how it is shown."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["at"] = "at"
    at: datetime
    tz: str = "UTC"

    _aware_at = field_validator("at")(_aware)
    _zone = field_validator("tz")(_check_zone)

    @property
    def one_shot(self) -> bool:
        return True

    def trigger(self) -> BaseTrigger:
        return DateTrigger(run_date=self.at.astimezone(UTC), timezone=UTC)

    def describe(self) -> str:
        return f"at {self.at.astimezone(ZoneInfo(self.tz)).isoformat()}"


class EverySchedule(BaseModel):
    """Every ``every_s`` seconds, at ``anchor`` + k × interval."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["every"] = "every"
    every_s: float = Field(gt=0)
    anchor: datetime

    _aware_anchor = field_validator("anchor")(_aware)

    @property
    def one_shot(self) -> bool:
        return False

    def trigger(self) -> BaseTrigger:
        # The first fire is one interval after the anchor, never the creation instant itself.
        first = self.anchor.astimezone(UTC) + timedelta(seconds=self.every_s)
        return IntervalTrigger(seconds=self.every_s, start_date=first, timezone=UTC)

    def describe(self) -> str:
        return f"every {format_duration(self.every_s)}"


class CronSchedule(BaseModel):
    """A 5-field crontab expression evaluated in ``tz``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["cron"] = "cron"
    expr: str
    tz: str = "UTC"

    _zone = field_validator("tz")(_check_zone)

    @field_validator("expr")
    @classmethod
    def _expression(cls, value: str) -> str:
        return parse_crontab(value).expression

    @property
    def one_shot(self) -> bool:
        return False

    def trigger(self) -> BaseTrigger:
        return parse_crontab(self.expr).trigger(ZoneInfo(self.tz))

    def describe(self) -> str:
        return f"cron {self.expr} ({self.tz})"


Schedule = Annotated[AtSchedule | EverySchedule | CronSchedule, Field(discriminator="kind")]


def timezone_option(tz: str | None, default_tz: str) -> str:
    """The timezone to use, validated; ScheduleError names ``tz``."""
    name = (tz or "").strip() or default_tz
    try:
        return _check_zone(name)
    except ValueError as exc:
        raise ScheduleError(f"tz: {exc}") from None


def parse_at(text: str, *, tz: str, now: datetime) -> AtSchedule:
    """An ISO-8601 time (offset optional: a naive time is read in ``tz``), in the future."""
    raw = str(text).strip()
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ScheduleError(
            f"at: {raw!r} is not an ISO-8601 time (e.g. 2027-03-28T09:00:00+02:00 or 2027-03-28 09:00)"
        ) from None
    if moment.tzinfo is None:
        # The job's zone, on cron's wall-clock rules: first pass of a repeated time, a skipped one at the jump.
        try:
            moment = wall_time(moment, ZoneInfo(tz)).first
        except OverflowError:
            raise ScheduleError(f"at: {raw!r} is out of range") from None
    if moment <= now:
        raise ScheduleError(f"at: {raw!r} is in the past (now is {now.astimezone(ZoneInfo(tz)).isoformat()})")
    return AtSchedule(at=moment.astimezone(UTC), tz=tz)


def parse_in(text: str, *, tz: str, now: datetime) -> AtSchedule:
    """``in 20m``: a one-shot at now + the duration, rounded up to the next whole second."""
    try:
        seconds = parse_duration(str(text).strip().removeprefix("in ").strip())
    except ValueError as exc:
        raise ScheduleError(f"in: {exc}") from None
    moment = now.astimezone(UTC) + timedelta(seconds=seconds)
    if moment.microsecond:
        moment = moment.replace(microsecond=0) + timedelta(seconds=1)
    return AtSchedule(at=moment, tz=tz)


def parse_every(text: str, *, now: datetime) -> EverySchedule:
    """``every 30m``: an interval of at least a minute, anchored at ``now`` (whole seconds)."""
    try:
        seconds = parse_duration(str(text).strip().removeprefix("every ").strip())
    except ValueError as exc:
        raise ScheduleError(f"every: {exc}") from None
    if seconds < MIN_EVERY_S:
        raise ScheduleError(f"every: {text!r} is too short; the minimum interval is 1m")
    if seconds > MAX_EVERY_S:
        raise ScheduleError(f"every: {text!r} is too long; the maximum interval is 366d")
    return EverySchedule(every_s=seconds, anchor=now.astimezone(UTC).replace(microsecond=0))


def parse_cron(expr: str, *, tz: str) -> CronSchedule:
    """A crontab expression in ``tz``."""
    try:
        return CronSchedule(expr=parse_crontab(expr).expression, tz=tz)
    except ValueError as exc:
        raise ScheduleError(str(exc)) from None


def build_schedule(
    *,
    at: str | None = None,
    in_: str | None = None,
    every: str | None = None,
    cron: str | None = None,
    tz: str | None = None,
    default_tz: str = "UTC",
    now: datetime,
) -> AtSchedule | EverySchedule | CronSchedule:
    """Exactly one of ``at``/``in_``/``every``/``cron`` (as given on the CLI or to the tool)."""
    given = {
        name: value for name, value in (("at", at), ("in", in_), ("every", every), ("cron", cron)) if value
    }
    if len(given) != 1:
        named = ", ".join(given) if given else "none"
        raise ScheduleError(f"give exactly one schedule: at, in, every or cron (got {named})")
    zone_name = timezone_option(tz, default_tz)
    if at:
        return parse_at(at, tz=zone_name, now=now)
    if in_:
        return parse_in(in_, tz=zone_name, now=now)
    if every:
        if tz:
            raise ScheduleError("tz: has no effect on an 'every' interval; use cron for wall-clock times")
        return parse_every(every, now=now)
    assert cron is not None
    return parse_cron(cron, tz=zone_name)


def parse_schedule(
    text: str, *, default_tz: str = "UTC", tz: str | None = None, now: datetime
) -> AtSchedule | EverySchedule | CronSchedule:
    """One string: ``in 20m``, ``every 1h``, ``at 2027-03-28T09:00``, ``cron 0 9 * * 1-5``,
    or a bare crontab expression / macro."""
    raw = " ".join(str(text).split())
    head, _, rest = raw.partition(" ")
    keyword = head.lower()
    if keyword == "in":
        return build_schedule(in_=rest, tz=tz, default_tz=default_tz, now=now)
    if keyword == "every":
        return build_schedule(every=rest, tz=tz, default_tz=default_tz, now=now)
    if keyword == "at":
        return build_schedule(at=rest, tz=tz, default_tz=default_tz, now=now)
    if keyword == "cron":
        return build_schedule(cron=rest, tz=tz, default_tz=default_tz, now=now)
    if raw.startswith("@") or len(raw.split(" ")) == 5:
        return build_schedule(cron=raw, tz=tz, default_tz=default_tz, now=now)
    raise ScheduleError(
        f"schedule {raw!r} not understood (use 'in 20m', 'every 1h', 'at 2027-03-28T09:00' or a cron expression)"
    )


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
