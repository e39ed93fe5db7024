"""Who may talk to the bot on Slack: ``allow_from`` users and ``channels`` (IDs).

An empty list admits nobody and ``"*"`` admits anyone. A DM needs its user allowed (or
``dm_policy: open``); a channel message needs the channel allowed and the user allowed.
With ``dm_policy: pairing`` the adapter adds a user approved by pairing through
:meth:`AccessPolicy.with_user` before asking.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

ANY = "*"


@dataclass(frozen=True)
class AccessPolicy:
    allow_from: frozenset[str]
    channels: frozenset[str]
    dm_open: bool = False

    @classmethod
    def of(cls, allow_from: Iterable[str], channels: Iterable[str], *, dm_open: bool = False) -> AccessPolicy:
        return cls(frozenset(s.strip() for s in allow_from), frozenset(s.strip() for s in channels), dm_open)

    def with_user(self, user_id: str) -> AccessPolicy:
        """This policy with one more allowed user (one approved by pairing)."""
        return replace(self, allow_from=self.allow_from | {user_id})

    def user_allowed(self, user_id: str) -> bool:
        return bool(user_id) and (ANY in self.allow_from or user_id in self.allow_from)

    def channel_allowed(self, channel_id: str) -> bool:
        return bool(channel_id) and (ANY in self.channels or channel_id in self.channels)

    def admits(self, *, is_dm: bool, channel_id: str, user_id: str) -> bool:
        if is_dm:
            return (self.dm_open and bool(user_id)) or self.user_allowed(user_id)
        return self.channel_allowed(channel_id) and self.user_allowed(user_id)
