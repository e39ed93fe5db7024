"""When a cron job runs: a one-shot time, a fixed interval, or a crontab expression.

Every form is stored as an absolute, replica-independent description so that all
replicas compute the same fire times: ``in 20m`` becomes an ``at`` time when the
job is created, and ``every`` is anchored at the creation time (fires at anchor +
k × interval). ``at`` accepts ISO-8601 with an offset (``Z`` included) or a naive
time, read in the job's timezone. Cron expressions are evaluated in an IANA
timezone (default ``scheduler.timezone``), see :mod:`scheduler.crontab`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger
from pydantic import BaseModel, ConfigDict, Field, field_validator

from scheduler.crontab import parse_crontab, wall_time
from scheduler.durations import format_duration, parse_duration
from scheduler.errors import CronError

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
