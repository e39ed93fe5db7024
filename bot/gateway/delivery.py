"""Idempotent delivery: each reply part is claimed in Redis before it is sent.

A part is claimed (``HSETNX``) before the send and marked sent after it, so a retried
run never sends a part twice. A replica dying between claim and send loses that part
rather than duplicating it: parts are at-most-once, which is what a chat reader
prefers. Whole results are stored before delivery, so a retried run re-delivers the
same text instead of asking the model again.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from agent.types import RunResult

_TTL_S = 7 * 24 * 3600


class DeliveryLedger:
    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._r = client
        self._prefix = prefix

    def _parts(self, run_id: str) -> str:
        return f"{self._prefix}:delivery:{run_id}"

    def _result(self, run_id: str) -> str:
        return f"{self._prefix}:result:{run_id}"

    async def claim(self, run_id: str, part: str) -> bool:
        """True exactly once per ``(run_id, part)``, across replicas and retries."""
        key = self._parts(run_id)
        pipe = self._r.pipeline(transaction=True)
        pipe.hsetnx(key, part, "sending")
        pipe.expire(key, _TTL_S)
        claimed, _ = await pipe.execute()
        return bool(claimed)

    async def mark(self, run_id: str, part: str, state: str) -> None:
        await self._r.hset(self._parts(run_id), part, state)

    async def states(self, run_id: str) -> dict[str, str]:
        return {str(k): str(v) for k, v in (await self._r.hgetall(self._parts(run_id))).items()}

    async def save_result(self, run_id: str, result: RunResult) -> None:
        await self._r.set(self._result(run_id), result.model_dump_json(), ex=_TTL_S)

    async def load_result(self, run_id: str) -> RunResult | None:
        raw = await self._r.get(self._result(run_id))
        return RunResult.model_validate_json(raw) if raw else None
