"""The scheduler's own settings, mirroring ``heartbeat`` and ``scheduler`` in the config.

They are plain dataclasses so the scheduler does not depend on ``bot``; the
daemon builds them with :meth:`HeartbeatSettings.from_config` and
:meth:`SchedulerSettings.from_config`, which read the same attribute names as
``bot.config.HeartbeatConfig`` / ``SchedulerConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from scheduler.heartbeat import ActiveHours
from scheduler.ports import JobTarget
from scheduler.schedules import parse_duration

MIN_HEARTBEAT_EVERY_S = 300.0
CatchUp = Literal["once", "skip"]


def zone(name: str, *, key: str) -> ZoneInfo:
    """``ZoneInfo(name)``, or ValueError naming the setting."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"{key}: unknown IANA timezone {name!r}") from exc


@dataclass(frozen=True)
class HeartbeatSettings:
    """``heartbeat.*``: a periodic self-check delivered to ``target``."""

    enabled: bool = False
    every: str = "30m"
    active_hours: str | None = None
    timezone: str = "UTC"
    target: JobTarget | None = None
    prompt: str | None = None
    # While the target session is busy the heartbeat waits and retries this often,
    # at most busy_max_retries times and never past the next fire.
    busy_retry_s: float = 30.0
    busy_max_retries: int = 20
    timeout_s: float = 600.0
    every_s: float = field(init=False)
    window: ActiveHours | None = field(init=False)

    def __post_init__(self) -> None:
        try:
            every_s = parse_duration(self.every)
        except ValueError as exc:
            raise ValueError(f"heartbeat.every: {exc}") from None
        if every_s < MIN_HEARTBEAT_EVERY_S:
            raise ValueError(f"heartbeat.every: must be at least 5m, got {self.every!r}")
        tz = zone(self.timezone, key="heartbeat.timezone")
        window = None
        if self.active_hours is not None:
            try:
                window = ActiveHours.parse(self.active_hours, tz)
            except ValueError as exc:
                raise ValueError(f"heartbeat.active_hours: {exc}") from None
        if self.enabled and self.target is None:
            raise ValueError("heartbeat.target: channel and chat_id are required when heartbeat is enabled")
        if self.busy_retry_s <= 0 or self.busy_max_retries < 0 or self.timeout_s <= 0:
            raise ValueError("heartbeat: busy_retry_s and timeout_s must be positive, busy_max_retries >= 0")
        object.__setattr__(self, "every_s", every_s)
        object.__setattr__(self, "window", window)

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> HeartbeatSettings:
        """From an object shaped like ``bot.config.HeartbeatConfig`` (duck-typed)."""
        raw_target = getattr(config, "target", None)
        target = None
        if (
            raw_target is not None
            and getattr(raw_target, "channel", None)
            and getattr(raw_target, "chat_id", None)
        ):
            target = JobTarget(
                channel=raw_target.channel,
                chat_id=raw_target.chat_id,
                thread_id=getattr(raw_target, "thread_id", None),
            )
        values: dict[str, Any] = {
            "enabled": bool(config.enabled),
            "every": str(config.every),
            "active_hours": config.active_hours,
            "timezone": str(config.timezone),
            "target": target,
            "prompt": config.prompt,
        }
        values.update(overrides)
        return cls(**values)


@dataclass(frozen=True)
class SchedulerSettings:
    """``scheduler.*`` plus the service's timing knobs (defaults suit production)."""

    timezone: str = "UTC"
    catch_up: CatchUp = "once"
    run_timeout_s: float = 600.0
    # A fire later than this (suspended host, blocked loop) counts as missed: with
    # catch_up "skip" it is recorded as skipped instead of run.
    misfire_grace_s: float = 60.0
    resync_interval_s: float = 30.0
    fire_claim_ttl_s: int = 7 * 86400
    run_now_max_age_s: float = 600.0

    def __post_init__(self) -> None:
        zone(self.timezone, key="scheduler.timezone")
        if self.catch_up not in ("once", "skip"):
            raise ValueError(f"scheduler.catch_up: must be 'once' or 'skip', got {self.catch_up!r}")
        for name in ("run_timeout_s", "misfire_grace_s", "resync_interval_s", "run_now_max_age_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"scheduler.{name}: must be positive")
        if self.fire_claim_ttl_s < 60:
            raise ValueError("scheduler.fire_claim_ttl_s: must be at least 60")

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> SchedulerSettings:
        """From an object shaped like ``bot.config.SchedulerConfig`` (duck-typed)."""
        values: dict[str, Any] = {"timezone": str(config.timezone), "catch_up": config.catch_up}
        values.update(overrides)
        return cls(**values)
