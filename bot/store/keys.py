"""Every Redis key botd uses, built in one place so names never drift apart.

All keys live under ``<prefix>:``. A key family is a method here; a new module that
needs its own family adds a method. The scheduler may not import ``bot``: it declares
the families it needs as ``scheduler.ports.CronKeys`` and the daemon hands it a
:class:`Keys`, which implements that protocol.
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

    def every_key(self) -> str:
        """A SCAN/KEYS match pattern for every key under this prefix."""
        return f"{self._prefix}:*"

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

    # Locks (bot.store.locks) and the compaction lease (bot.compactor).
    def lock(self, session_key: str) -> str:
        return self.key("lock", session_key)

    def compaction(self, session_key: str) -> str:
        """Held while one compaction of the session runs."""
        return self.key("compaction", session_key)

    # Inbound dedupe (bot.gateway.inbox) and the adapters' key-value space (bot.store.kv).
    def dedupe(self, key: str) -> str:
        return self.key("dedupe", key)

    def run_mark(self, run_id: str) -> str:
        """The dedupe mark of a message that has no dedupe key of its own (the console's)."""
        return self.dedupe(f"run:{run_id}")

    def kv(self, key: str) -> str:
        return self.key("kv", key)

    # The gateway's queue (bot.gateway.inbox) and retries (bot.gateway.worker).
    def inbox(self, session_key: str) -> str:
        return self.key("inbox", session_key)

    def running(self, session_key: str) -> str:
        """The batch a worker took and has not finished yet."""
        return self.key("running", session_key)

    def pending(self) -> str:
        """Sorted set of sessions with work, scored by when the work arrived."""
        return self.key("pending")

    def taken(self, op_id: str) -> str:
        """How many messages one take moved into a running list, for two minutes: the same
        take sent again (its reply lost) hands those over instead of moving nothing."""
        return self.key("taken", op_id)

    def resumes(self, run_id: str) -> str:
        """The ids of the resumes of a batch (a set): a resume counted again after its
        reply was lost counts once."""
        return self.key("resumes", run_id)

    # Signals between replicas (bot.gateway.signals, bot.gateway.approvals).
    def cancel_channel(self) -> str:
        return self.key("cancel")

    def cancel(self, session_key: str) -> str:
        return self.key("cancel", session_key)

    def outcomes_channel(self) -> str:
        return self.key("outcomes")

    def outcome(self, run_id: str) -> str:
        return self.key("outcome", run_id)

    def approvals_channel(self) -> str:
        return self.key("approvals")

    def approval(self, approval_id: str) -> str:
        return self.key("approval", approval_id)

    # Delivery (bot.gateway.reply) and traces (bot.tracing).
    def delivery(self, run_id: str) -> str:
        return self.key("delivery", run_id)

    def result(self, run_id: str) -> str:
        return self.key("result", run_id)

    def trace(self, run_id: str) -> str:
        return self.key("trace", run_id)

    def trace_index(self) -> str:
        return self.key("traces")

    # The scheduler (scheduler.store, through scheduler.ports.CronKeys).
    def fire(self, job_id: str, fire_time: str) -> str:
        """The claim of one fire (DESIGN.md §5: ``<prefix>:fire:<job>:<fire_time>``)."""
        return self.key("fire", job_id, fire_time)

    def cron_job(self, job_id: str) -> str:
        return self.key("cron", "job", job_id)

    def cron_jobs(self) -> str:
        return self.key("cron", "jobs")

    def cron_changes(self) -> str:
        return self.key("cron", "changes")

    def cron_last_fire(self) -> str:
        return self.key("cron", "last_fire")

    def cron_running(self, job_id: str) -> str:
        return self.key("cron", "running", job_id)

    def cron_runs(self, job_id: str) -> str:
        return self.key("cron", "runs", job_id)

    def cron_run_now(self) -> str:
        return self.key("cron", "run_now")

    def cron_run_now_taken(self, op_id: str) -> str:
        """The request one pop took, for a moment: the pop sent again hands it over."""
        return self.key("cron", "run_now", "taken", op_id)

    # Running daemons (bot.replicas): one expiring key each, and an index scored by last beat.
    def replica(self, replica_id: str) -> str:
        return self.key("replica", replica_id)

    def replica_index(self) -> str:
        return self.key("replicas")

    # DM pairing (bot.pairing): live codes, each user's live code, reply budgets, approvals.
    def pairing_code(self, code: str) -> str:
        return self.key("pairing", "code", code)

    def pairing_user(self, channel: str, user_id: str) -> str:
        """The live code of one user (or the denied marker), so a repeated DM repeats it."""
        return self.key("pairing", "user", channel, user_id)

    def pairing_replied(self, channel: str, user_id: str, hour: str) -> str:
        """Set of the code replies' ids a stranger got in one hour (at most the budget)."""
        return self.key("pairing", "replied", channel, user_id, hour)

    def pairing_pending(self) -> str:
        """Sorted set of live codes scored by expiry (unix seconds), for listing."""
        return self.key("pairing", "pending")

    def pairing_approved(self, channel: str) -> str:
        """Hash of approved user id -> JSON record."""
        return self.key("pairing", "approved", channel)

    def pairing_events(self) -> str:
        """Pub/sub channel on which approvals reach the daemon, which tells the user."""
        return self.key("pairing", "events")

    def pairing_notified(self, code: str) -> str:
        return self.key("pairing", "notified", code)

    # Reply parts waiting to be delivered again (bot.gateway.redelivery).
    def redelivery_due(self) -> str:
        """Sorted set of pending parts scored by their next attempt (unix seconds)."""
        return self.key("redelivery", "due")

    def redelivery_items(self) -> str:
        """Hash of pending parts: member -> what to send and where."""
        return self.key("redelivery", "items")

    def redelivery_claims(self) -> str:
        """Hash of pending parts: member -> the token of its last claim (its retry's proof)."""
        return self.key("redelivery", "claims")
