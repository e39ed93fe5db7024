"""The heartbeat's daily window, e.g. ``09:00-22:00`` in a given IANA timezone.

The end is exclusive, ``24:00`` is allowed as an end, and a window whose end is
before its start crosses midnight (``22:00-06:00`` is 22:00 until 06:00 next day).
Membership is read on the wall clock, like a cron job's ``*`` fields: both passes of
a repeated hour count, a wall time skipped by a change never happens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

_WINDOW = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")
_DAY_S = 24 * 3600


@dataclass(frozen=True)
class ActiveHours:
    """Seconds-of-day bounds in ``timezone``; ``start_s`` inclusive, ``end_s`` exclusive."""

    start_s: int
    end_s: int
    timezone: ZoneInfo

    @classmethod
    def parse(cls, text: str, timezone: str | ZoneInfo) -> ActiveHours:
        """Parse ``HH:MM-HH:MM``; raises ValueError naming what is wrong."""
        match = _WINDOW.match(text or "")
        if not match:
            raise ValueError(f'active_hours must look like "09:00-22:00", got {text!r}')
        sh, sm, eh, em = (int(g) for g in match.groups())
        if sm > 59 or em > 59:
            raise ValueError(f"active_hours {text!r}: minutes must be 00-59")
        if sh > 23:
            raise ValueError(f"active_hours {text!r}: the start hour must be 00-23")
        if eh > 24 or (eh == 24 and em != 0):
            raise ValueError(f"active_hours {text!r}: the end must be at most 24:00")
        start, end = (sh * 60 + sm) * 60, (eh * 60 + em) * 60
        if start == end:
            raise ValueError(f"active_hours {text!r}: start and end are the same time")
        tz = timezone if isinstance(timezone, ZoneInfo) else ZoneInfo(timezone)
        return cls(start_s=start, end_s=end, timezone=tz)

    def contains(self, moment: datetime) -> bool:
        """Whether the aware ``moment`` falls inside the window (local wall clock)."""
        local = moment.astimezone(self.timezone)
        second = local.hour * 3600 + local.minute * 60 + local.second
        if self.start_s < self.end_s:
            return self.start_s <= second < self.end_s
        return second >= self.start_s or second < self.end_s

    def describe(self) -> str:
        def hhmm(seconds: int) -> str:
            return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}"

        return f"{hhmm(self.start_s)}-{hhmm(self.end_s)} {self.timezone.key}"
