"""Schedule forms (at / in / every / cron) and job fields: valid input and clear errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduler.jobs import CronJob, parse_grants, validate_job_id
from scheduler.ports import JobTarget
from scheduler.schedules import (
    AtSchedule,
    CronError,
    CronSchedule,
    EverySchedule,
    ScheduleError,
    build_schedule,
    format_duration,
    parse_at,
    parse_duration,
    parse_every,
    parse_in,
    parse_schedule,
)

NOW = datetime(2027, 3, 20, 10, 15, 30, 250_000, tzinfo=UTC)


def test_in_becomes_an_absolute_time_rounded_up_to_the_second() -> None:
    schedule = parse_in("20m", tz="UTC", now=NOW)
    assert schedule.at == datetime(2027, 3, 20, 10, 35, 31, tzinfo=UTC)
    assert parse_in("in 1h30m", tz="UTC", now=NOW).at == datetime(2027, 3, 20, 11, 45, 31, tzinfo=UTC)
    assert schedule.one_shot


@pytest.mark.parametrize(
    ("text", "message"),
    [("20x", "in: not a duration"), ("", "in: empty duration"), ("0s", "in: duration must be positive")],
)
def test_in_rejects_bad_durations(text: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        parse_in(text, tz="UTC", now=NOW)


def test_at_with_offset_z_and_naive_in_timezone() -> None:
    assert parse_at("2027-03-28T09:00:00+02:00", tz="UTC", now=NOW).at == datetime(2027, 3, 28, 7, tzinfo=UTC)
    assert parse_at("2027-03-28T09:00:00Z", tz="UTC", now=NOW).at == datetime(2027, 3, 28, 9, tzinfo=UTC)
    # Naive: read in the given zone (Berlin is on CEST, +2, on the 28th after 03:00).
    berlin = parse_at("2027-03-28 09:00", tz="Europe/Berlin", now=NOW)
    assert berlin.at == datetime(2027, 3, 28, 7, tzinfo=UTC)
    assert berlin.describe() == "at 2027-03-28T09:00:00+02:00"
    # The day before the change, the same wall time is one hour later in UTC.
    assert parse_at("2027-03-27 09:00", tz="Europe/Berlin", now=NOW).at == datetime(
        2027, 3, 27, 8, tzinfo=UTC
    )


def test_at_rejects_garbage_and_the_past() -> None:
    with pytest.raises(ScheduleError, match="at: 'tomorrow' is not an ISO-8601 time"):
        parse_at("tomorrow", tz="UTC", now=NOW)
    with pytest.raises(ScheduleError, match="at: .* is in the past"):
        parse_at("2027-03-20T10:00:00Z", tz="UTC", now=NOW)


def test_every_is_anchored_at_creation() -> None:
    schedule = parse_every("30m", now=NOW)
    assert schedule.every_s == 1800
    assert schedule.anchor == NOW.replace(microsecond=0)
    trigger = schedule.trigger()
    first = trigger.get_next_fire_time(None, NOW)
    assert first == schedule.anchor + timedelta(minutes=30)
    assert trigger.get_next_fire_time(first, first) == schedule.anchor + timedelta(minutes=60)
    assert schedule.describe() == "every 30m"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("30s", "too short; the minimum interval is 1m"),
        ("400d", "too long"),
        ("often", "every: not a duration"),
    ],
)
def test_every_rejects_bad_intervals(text: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        parse_every(text, now=NOW)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, r"give exactly one schedule: at, in, every or cron \(got none\)"),
        ({"in_": "5m", "every": "1h"}, r"got in, every"),
        ({"cron": "0 9 * * *", "tz": "Mars/Olympus"}, "tz: unknown IANA timezone 'Mars/Olympus'"),
        ({"every": "1h", "tz": "Europe/Berlin"}, "tz: has no effect on an 'every' interval"),
        ({"cron": "61 * * * *"}, "cron: minute value 61 .* out of range 0-59"),
    ],
)
def test_build_schedule_errors_name_the_problem(options: dict[str, str], message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        build_schedule(now=NOW, **options)


def test_build_schedule_uses_default_timezone_for_cron() -> None:
    schedule = build_schedule(cron="0 9 * * 1-5", default_tz="Europe/Berlin", now=NOW)
    assert isinstance(schedule, CronSchedule)
    assert (schedule.expr, schedule.tz) == ("0 9 * * 1-5", "Europe/Berlin")
    assert (
        build_schedule(cron="0 9 * * *", tz="Asia/Tokyo", default_tz="Europe/Berlin", now=NOW).tz
        == "Asia/Tokyo"
    )


def test_parse_schedule_single_string_forms() -> None:
    assert isinstance(parse_schedule("in 20m", now=NOW), AtSchedule)
    assert isinstance(parse_schedule("every 1h", now=NOW), EverySchedule)
    assert isinstance(parse_schedule("at 2027-04-01T08:00:00Z", now=NOW), AtSchedule)
    assert parse_schedule("cron */15 * * * *", now=NOW).describe() == "cron */15 * * * * (UTC)"
    assert parse_schedule("0  9 * *   mon-fri", default_tz="Europe/Berlin", now=NOW).describe() == (
        "cron 0 9 * * mon-fri (Europe/Berlin)"
    )
    assert isinstance(parse_schedule("@daily", now=NOW), CronSchedule)
    with pytest.raises(ScheduleError, match="not understood"):
        parse_schedule("whenever you like", now=NOW)


def test_schedule_errors_are_cron_errors_and_value_errors() -> None:
    with pytest.raises(CronError):
        parse_in("x", tz="UTC", now=NOW)
    with pytest.raises(ValueError):
        parse_in("x", tz="UTC", now=NOW)


def test_job_round_trips_through_json_with_each_schedule_kind() -> None:
    target = JobTarget(channel="telegram", chat_id=42)  # type: ignore[arg-type]
    for schedule in (
        parse_in("5m", tz="Europe/Berlin", now=NOW),
        parse_every("1h", now=NOW),
        build_schedule(cron="0 9 * * 0", tz="Europe/Berlin", now=NOW),
    ):
        job = CronJob(
            id="daily-1", schedule=schedule, prompt="say hi", target=target, allow=["write"], created_at=NOW
        )
        again = CronJob.model_validate_json(job.model_dump_json())
        assert again == job
        assert again.schedule.kind == schedule.kind
        assert again.target.chat_id == "42"
        assert again.tool_policy().allow == ("write",)
        assert again.tool_policy().context == "scheduled"


def test_stored_models_reject_naive_times_and_bad_zones() -> None:
    with pytest.raises(ValueError, match="must carry a timezone"):
        AtSchedule(at=datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="unknown IANA timezone"):
        CronSchedule(expr="0 9 * * *", tz="Nowhere/Land")
    with pytest.raises(ValueError, match="day-of-week"):
        CronSchedule(expr="0 9 * * funday", tz="UTC")


@pytest.mark.parametrize("bad", ["", "-x", "a b", "x" * 65, "a:b", "heartbeat", "HEARTBEAT", "ü"])
def test_job_ids_are_validated(bad: str) -> None:
    with pytest.raises(ValueError, match="job id"):
        validate_job_id(bad)


def test_good_job_ids_pass() -> None:
    assert validate_job_id(" morning-report_2 ") == "morning-report_2"


def test_grants() -> None:
    assert parse_grants("admin, write,read") == ("write", "admin")
    assert parse_grants(["write", "write"]) == ("write",)
    assert parse_grants(None) == ()
    with pytest.raises(ValueError, match="unknown tool category 'root'"):
        parse_grants("write,root")


def test_format_duration_reads_back() -> None:
    for seconds in (45, 60, 90, 1800, 3600, 5400, 86400, 90000):
        assert parse_duration(format_duration(seconds)) == seconds
    assert format_duration(5400) == "1h30m"
