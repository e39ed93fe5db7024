"""Every Redis key botd uses, built in one place so names never drift apart.

All keys live under ``<prefix>:``. A key family is a method here; a new module that
needs its own family adds a method (or, while prototyping, calls :meth:`Keys.key`).
Session keys themselves contain colons (``agent:main:telegram:dm:42``); that is fine
because keys are only ever built, never parsed back — listings use the index set.
"""

from __future__ import annotations

import re

_PREFIX = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class Keys:
    """Builds ``<prefix>:<family>:<parts…>`` keys."""

    __slots__ = ("_prefix",)

    def __init__(self, prefix: str) -> None:
        if not _PREFIX.fullmatch(prefix):
            raise ValueError(f"redis prefix must match {_PREFIX.pattern}, got {prefix!r}")
        self._prefix = prefix

    @property
    def prefix(self) -> str:
        return self._prefix

    def key(self, family: str, *parts: str) -> str:
        """The generic builder every family method uses; empty parts are a bug, so refused."""
        for part in (family, *parts):
            if not isinstance(part, str) or not part:
                raise ValueError(f"redis key parts must be non-empty strings, got {part!r}")
        return ":".join((self._prefix, family, *parts))

    def pattern(self, family: str) -> str:
        """A SCAN/KEYS match pattern for one family."""
        return f"{self.key(family)}:*"

    # Sessions (bot.store.sessions).
    def session_messages(self, session_key: str) -> str:
        return self.key("session", session_key, "messages")

    def session_meta(self, session_key: str) -> str:
        return self.key("session", session_key, "meta")

    def session_summary(self, session_key: str) -> str:
        return self.key("session", session_key, "summary")

    def session_ops(self, session_key: str) -> str:
        """Recently applied write ids of a session, so retried writes apply once."""
        return self.key("session", session_key, "ops")

    def session_index(self) -> str:
        """Sorted set of session keys scored by last activity (unix seconds)."""
        return self.key("sessions")

    # Locks and leases (bot.store.locks).
    def lock(self, session_key: str) -> str:
        return self.key("lock", session_key)

    def lease(self, name: str) -> str:
        return self.key("lease", name)

    # Inbound dedupe (bot.store.dedupe) and the adapters' key-value space (bot.store.kv).
    def dedupe(self, key: str) -> str:
        return self.key("dedupe", key)

    def kv(self, key: str) -> str:
        return self.key("kv", key)

    # Scheduler fire claims (DESIGN.md §5: ``<prefix>:fire:<job>:<fire_time>``).
    def fire(self, job_id: str, fire_time: str) -> str:
        return self.key("fire", job_id, fire_time)

    # Reply parts waiting to be delivered again (bot.gateway.redelivery).
    def redelivery_due(self) -> str:
        """Sorted set of pending parts scored by their next attempt (unix seconds)."""
        return self.key("redelivery", "due")

    def redelivery_items(self) -> str:
        """Hash of pending parts: member -> what to send and where."""
        return self.key("redelivery", "items")
