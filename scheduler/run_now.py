"""``botd cron run-now ID`` against a running daemon, through Redis.

The CLI appends a request to the list ``<prefix>:cron:run_now`` and publishes
``{"op": "run_now"}`` on ``<prefix>:cron:changes``. Every replica's scheduler
drains the list with ``LPOP`` when it hears that (and at every periodic resync,
in case the message was missed); ``LPOP`` hands each request to exactly one
replica. The run lands in the job's ledger with ``trigger = "run_now"`` and the
request id, which is how the CLI can wait for the result. A request older than
``scheduler.run_now_max_age_s`` (10 minutes) when taken is recorded as skipped
instead of run, so a request made while no daemon was up does not fire hours later.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from scheduler.claims import text


class RunNowRequest(BaseModel):
    job_id: str
    request_id: str
    requested_at: datetime


class RunNowQueue:
    """The list of pending run-now requests for one key prefix."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self._redis = redis
        self.key = f"{prefix}:cron:run_now"

    async def push(self, job_id: str, now: datetime) -> RunNowRequest:
        request = RunNowRequest(job_id=job_id, request_id=uuid.uuid4().hex[:12], requested_at=now)
        await self._redis.rpush(self.key, request.model_dump_json())
        return request

    async def pop(self) -> RunNowRequest | None:
        """The oldest request, skipping entries that do not parse; None when empty."""
        while True:
            raw = await self._redis.lpop(self.key)
            if raw is None:
                return None
            try:
                return RunNowRequest.model_validate_json(text(raw))
            except ValidationError:
                continue

    async def pending(self) -> int:
        return int(await self._redis.llen(self.key))
