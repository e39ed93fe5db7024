"""Time as the scheduler sees it: an injectable clock and the one UTC text form.

Fire claims and ledger entries are keyed by the *scheduled* time written in one
canonical form, so every replica derives the same key for the same fire.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

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
