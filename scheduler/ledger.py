"""The run ledger: the last runs of every job (and of the heartbeat), newest first.

``<prefix>:cron:runs:<job_id>`` is a Redis list capped at 100 entries, one JSON
:class:`RunRecord` each. ``run_status`` (did the run do its work) and
``delivery_status`` (did its output reach the chat) are kept apart.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from scheduler.ports import DeliveryStatus, ScheduledRunStatus

FireTrigger = Literal["schedule", "catch_up", "run_now"]
LEDGER_SIZE = 100
MAX_ERROR_CHARS = 2000


class RunRecord(BaseModel):
    """One fire of a job: when, why, what became of the run and of its delivery."""

    model_config = ConfigDict(extra="ignore")

    job_id: str
    run_id: str | None = None
    fire_time: datetime | None = None
    trigger: FireTrigger = "schedule"
    request_id: str | None = None
    started_at: datetime
    finished_at: datetime
    run_status: ScheduledRunStatus
    delivery_status: DeliveryStatus = "unknown"
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.run_status in ("error", "timeout")


def clip_error(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…"


class RunLedger:
    """Append and read run records (each job's list is capped at :data:`LEDGER_SIZE`)."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self._redis = redis
        self._prefix = prefix

    def key(self, job_id: str) -> str:
        return f"{self._prefix}:cron:runs:{job_id}"

    async def append(self, record: RunRecord) -> None:
        key = self.key(record.job_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.lpush(key, record.model_dump_json())
            pipe.ltrim(key, 0, LEDGER_SIZE - 1)
            pipe.persist(key)
            await pipe.execute()

    async def recent(self, job_id: str, limit: int = LEDGER_SIZE) -> list[RunRecord]:
        """Newest first; entries that no longer parse are left out."""
        raw = await self._redis.lrange(self.key(job_id), 0, max(limit, 1) - 1)
        records = []
        for item in raw:
            try:
                records.append(RunRecord.model_validate_json(item))
            except ValidationError:
                continue
        return records

    async def expire(self, job_id: str, ttl_s: int) -> None:
        """Keep a removed job's history for a while, then let it go."""
        await self._redis.expire(self.key(job_id), ttl_s)

    @staticmethod
    def skipped(
        job_id: str,
        reason: str,
        *,
        at: datetime,
        fire_time: datetime | None,
        trigger: FireTrigger,
        request_id: str | None = None,
    ) -> RunRecord:
        """A record for a fire that was decided not to run (no LLM call was made)."""
        return RunRecord(
            job_id=job_id,
            fire_time=fire_time,
            trigger=trigger,
            request_id=request_id,
            started_at=at,
            finished_at=at,
            run_status="skipped",
            error=reason,
        )
