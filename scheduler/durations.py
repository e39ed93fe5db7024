"""Human durations such as ``30m``, ``1h30m``, ``2d`` or ``45s``."""

from __future__ import annotations

import re

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
