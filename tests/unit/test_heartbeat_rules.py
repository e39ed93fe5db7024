"""Heartbeat rules without Redis: active hours, HEARTBEAT.md emptiness, settings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from bot.config import HeartbeatConfig, SchedulerConfig
from scheduler.heartbeat import ActiveHours, clip_heartbeat_text, is_effectively_empty, read_heartbeat_file
from scheduler.ports import JobTarget
from scheduler.settings import HeartbeatSettings, SchedulerSettings


def at_utc(hour: int, minute: int = 0, second: int = 0) -> datetime:
    return datetime(2027, 1, 15, hour, minute, second, tzinfo=UTC)


def test_daytime_window_end_is_exclusive() -> None:
    window = ActiveHours.parse("09:00-22:00", "UTC")
    assert not window.contains(at_utc(8, 59, 59))
    assert window.contains(at_utc(9))
    assert window.contains(at_utc(21, 59, 59))
    assert not window.contains(at_utc(22))


def test_window_crossing_midnight() -> None:
    window = ActiveHours.parse("22:00-06:00", "UTC")
    assert window.contains(at_utc(22))
    assert window.contains(at_utc(23, 59))
    assert window.contains(at_utc(0))
    assert window.contains(at_utc(5, 59, 59))
    assert not window.contains(at_utc(6))
    assert not window.contains(at_utc(12))
    assert not window.contains(at_utc(21, 59, 59))


def test_end_of_day_as_24_00_and_00_00() -> None:
    until_midnight = ActiveHours.parse("18:00-24:00", "UTC")
    assert until_midnight.contains(at_utc(23, 59, 59))
    assert not until_midnight.contains(at_utc(0))
    assert not until_midnight.contains(at_utc(17, 59))
    assert ActiveHours.parse("18:00-00:00", "UTC").contains(at_utc(23))
    whole_day = ActiveHours.parse("00:00-24:00", "UTC")
    assert whole_day.contains(at_utc(0)) and whole_day.contains(at_utc(23, 59, 59))


def test_window_is_read_in_its_timezone() -> None:
    window = ActiveHours.parse("09:00-22:00", "Europe/Berlin")
    # 07:30 UTC in July is 09:30 in Berlin (CEST); 07:30 UTC in January is 08:30 (CET).
    assert window.contains(datetime(2027, 7, 1, 7, 30, tzinfo=UTC))
    assert not window.contains(datetime(2027, 1, 15, 7, 30, tzinfo=UTC))
    assert window.describe() == "09:00-22:00 Europe/Berlin"


def active_fires(window: ActiveHours, start: datetime, end: datetime, every: timedelta) -> list[str]:
    """UTC HH:MM of the heartbeat grid points inside the window."""
    out, at = [], start
    while at < end:
        if window.contains(at):
            out.append(at.strftime("%H:%M"))
        at += every
    return out


def test_active_hours_follow_the_wall_clock_across_offset_changes() -> None:
    half_hour = timedelta(minutes=30)
    # Berlin falls back on 2025-10-26 (03:00 CEST -> 02:00 CET): 02:xx happens twice, both count.
    autumn = ActiveHours.parse("01:00-03:00", "Europe/Berlin")
    fires = active_fires(autumn, datetime(2025, 10, 25, 22, tzinfo=UTC), datetime(2025, 10, 26, 3, tzinfo=UTC), half_hour)
    assert fires == ["23:00", "23:30", "00:00", "00:30", "01:00", "01:30"]  # three real hours
    # Spring (2025-03-30, 02:00 CET -> 03:00 CEST): the skipped hour never happens, the window goes on.
    spring = ActiveHours.parse("01:00-03:30", "Europe/Berlin")
    fires = active_fires(spring, datetime(2025, 3, 29, 23, tzinfo=UTC), datetime(2025, 3, 30, 3, tzinfo=UTC), half_hour)
    assert fires == ["00:00", "00:30", "01:00"]
    # Santiago has no midnight on 2025-09-07: a window across midnight is not cut short.
    night = ActiveHours.parse("22:00-06:00", "America/Santiago")
    fires = active_fires(night, datetime(2025, 9, 7, 1, tzinfo=UTC), datetime(2025, 9, 7, 10, tzinfo=UTC), timedelta(hours=1))
    assert fires == ["02:00", "03:00", "04:00", "05:00", "06:00", "07:00", "08:00"]
    # Lord Howe falls back by 30 minutes (02:00 -> 01:30 on 2025-04-06): both passes of 01:30-02:00.
    twice = ActiveHours.parse("01:30-02:00", "Australia/Lord_Howe")
    fires = active_fires(twice, datetime(2025, 4, 5, 13, tzinfo=UTC), datetime(2025, 4, 5, 17, tzinfo=UTC), timedelta(minutes=15))
    assert fires == ["14:30", "14:45", "15:00", "15:15"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("9-22", "must look like"),
        ("09:00", "must look like"),
        ("25:00-26:00", "start hour must be 00-23"),
        ("09:60-10:00", "minutes must be 00-59"),
        ("09:00-24:30", "end must be at most 24:00"),
        ("24:00-06:00", "start hour"),
        ("09:00-09:00", "start and end are the same"),
        ("00:00-00:00", "start and end are the same"),
    ],
)
def test_bad_windows(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ActiveHours.parse(text, "UTC")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n   \n",
        "# Heartbeat\n\n## Tasks\n",
        "<!-- add tasks here -->\n",
        "# Tasks\n<!--\n- check mail\n- water plants\n-->\n",
        "- \n* [ ]\n+ [x]\n1.\n2) [ ]\n",
        "Heartbeat\n=========\n\n---\n",
        "#\n###### deep heading\n",
    ],
)
def test_effectively_empty(text: str) -> None:
    assert is_effectively_empty(text)


@pytest.mark.parametrize(
    "text",
    [
        "Check the inbox",
        "# Tasks\n- check the inbox\n",
        "- [ ] water the plants",
        "<!-- note --> remind me to stretch",
        "#hashtag-is-text",
        "1. call mom",
        "Tasks\n- feed the cat\n---",
    ],
)
def test_not_empty(text: str) -> None:
    assert not is_effectively_empty(text)


def test_unclosed_comment_hides_the_rest() -> None:
    assert is_effectively_empty("<!-- unclosed comment hides the rest\n- task")


def test_read_missing_file_is_empty(tmp_path: Path) -> None:
    assert read_heartbeat_file(tmp_path) == ""
    (tmp_path / "HEARTBEAT.md").write_text("- check\n", encoding="utf-8")
    assert read_heartbeat_file(tmp_path) == "- check\n"


def test_clip_long_checklists() -> None:
    assert clip_heartbeat_text("  short \n") == "short"
    clipped = clip_heartbeat_text("x" * 50, limit=10)
    assert clipped.startswith("x" * 10) and "truncated: 10 of 50" in clipped


def test_heartbeat_settings_validation() -> None:
    target = JobTarget(channel="telegram", chat_id="1")
    settings = HeartbeatSettings(
        enabled=True, every="30m", active_hours="22:00-06:00", timezone="Asia/Tokyo", target=target
    )
    assert settings.every_s == 1800
    assert settings.window is not None and settings.window.timezone.key == "Asia/Tokyo"
    with pytest.raises(ValueError, match="heartbeat.every: must be at least 5m"):
        HeartbeatSettings(every="4m")
    with pytest.raises(ValueError, match="heartbeat.every: not a duration"):
        HeartbeatSettings(every="soon")
    with pytest.raises(ValueError, match="heartbeat.timezone: unknown IANA timezone"):
        HeartbeatSettings(timezone="Moon/Base")
    with pytest.raises(ValueError, match="heartbeat.active_hours: .*same time"):
        HeartbeatSettings(active_hours="10:00-10:00")
    with pytest.raises(ValueError, match="heartbeat.target: channel and chat_id are required"):
        HeartbeatSettings(enabled=True)


def test_settings_from_the_daemon_config_models() -> None:
    config = HeartbeatConfig(
        enabled=True,
        every="1h",
        active_hours="09:00-22:00",
        timezone="Europe/Berlin",
        target={"channel": "slack", "chat_id": "C1", "thread_id": "171.2"},
        prompt="Check things.",
    )
    settings = HeartbeatSettings.from_config(config, busy_retry_s=5)
    assert settings.target == JobTarget(channel="slack", chat_id="C1", thread_id="171.2")
    assert (settings.every_s, settings.prompt, settings.busy_retry_s) == (3600, "Check things.", 5)
    assert HeartbeatSettings.from_config(HeartbeatConfig()).target is None
    scheduler = SchedulerSettings.from_config(SchedulerConfig(timezone="Europe/Berlin", catch_up="skip"))
    assert (scheduler.timezone, scheduler.catch_up, scheduler.run_timeout_s) == ("Europe/Berlin", "skip", 600)
    duck = SimpleNamespace(timezone="UTC", catch_up="once")
    assert SchedulerSettings.from_config(duck, resync_interval_s=5).resync_interval_s == 5


def test_scheduler_settings_validation() -> None:
    with pytest.raises(ValueError, match="scheduler.catch_up"):
        SchedulerSettings(catch_up="always")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scheduler.timezone"):
        SchedulerSettings(timezone="Nope")
    with pytest.raises(ValueError, match="scheduler.run_timeout_s"):
        SchedulerSettings(run_timeout_s=0)
