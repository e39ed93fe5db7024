"""Approvals for admin tools: ask the chat, wait for ``/approve ID`` or ``/deny ID``.

The request lives in Redis, so the answer may arrive on any replica; a broadcast wakes
the waiting run at once and a one-second poll of the key covers a missed broadcast.
No answer within the timeout, or a ``/stop``, denies: approvals fail closed.

The stored record is not trusted: the replica that takes the ``/approve`` from an
allowed user in the chat stores a MAC over (id, answer, chat) keyed by the daemon
key, and the waiting run counts an approval only when that MAC verifies for its own
request. A write to the store alone cannot approve anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
import structlog

from bot.gateway.signals import Broadcast
from bot.store.keys import Keys
from bot.store.seal import RecordSeal

log = structlog.get_logger(__name__)

# ARGV[5] is the answer's own id ('' for the daemon's own expiry or cancel): the same answer
# sent again after its reply was lost finds it recorded and is still 'ok'; any other finds
# the request already answered.
_RESOLVE = """
local raw = redis.call('GET', KEYS[1])
if not raw then return 'missing' end
local data = cjson.decode(raw)
if data['status'] ~= 'pending' then
  if ARGV[5] ~= '' and data['answer'] == ARGV[5] then return 'ok' end
  return data['status']
end
if ARGV[2] ~= '' and data['chat_id'] ~= ARGV[2] then return 'wrong_chat' end
data['status'] = ARGV[1]
data['by'] = ARGV[3]
data['mac'] = ARGV[4]
data['answer'] = ARGV[5]
redis.call('SET', KEYS[1], cjson.encode(data), 'KEEPTTL')
return 'ok'
"""

AskFn = Callable[[str, str], Awaitable[None]]


def summarize_call(tool: str, args: dict[str, Any], limit: int = 600) -> str:
    text = json.dumps(args, ensure_ascii=False, sort_keys=True)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return f"{tool} {text}"


class Approvals:
    def __init__(
        self, client: aioredis.Redis, prefix: str, broadcast: Broadcast, timeout_s: float = 300.0,
        *, seal: RecordSeal,
    ) -> None:
        self._seal = seal
        self._r = client
        self._keys = Keys(prefix)
        self._timeout_s = timeout_s
        self._waiters: dict[str, asyncio.Event] = {}
        self._resolve = client.register_script(_RESOLVE)
        self._broadcast = broadcast
        broadcast.on(self.channel, self._on_message)

    @property
    def channel(self) -> str:
        return self._keys.approvals_channel()

    def _key(self, approval_id: str) -> str:
        return self._keys.approval(approval_id)

    async def request(
        self, *, session_key: str, chat_id: str, run_id: str, user_id: str, tool: str, args: dict[str, Any], ask: AskFn
    ) -> bool:
        """Post an approval request through ``ask`` and wait for the answer (False on timeout)."""
        approval_id = secrets.token_hex(4)
        data = {
            "status": "pending", "session": session_key, "chat_id": chat_id, "run_id": run_id,
            "user_id": user_id, "tool": tool,
        }
        key = self._key(approval_id)
        await self._r.set(key, json.dumps(data), ex=int(self._timeout_s) + 3600)
        event = self._waiters[approval_id] = asyncio.Event()
        try:
            await ask(approval_id, summarize_call(tool, args))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self._timeout_s
            while True:
                status = await self._status(key, approval_id, chat_id)
                if status != "pending":
                    log.info("approval.answered", approval_id=approval_id, tool=tool, status=status)
                    return status == "approved"
                remaining = deadline - loop.time()
                if remaining <= 0:
                    await self._finish(key, "expired")
                    log.info("approval.expired", approval_id=approval_id, tool=tool)
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout=min(1.0, remaining))
                event.clear()
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._finish(key, "cancelled"))
            raise
        finally:
            self._waiters.pop(approval_id, None)

    async def resolve(self, approval_id: str, approved: bool, *, chat_id: str, user_id: str) -> str:
        """Answer a pending request; returns a short reply for the person who answered."""
        status = "approved" if approved else "denied"
        mac = self._seal.sign("approval", approval_id, status, chat_id)
        answer = secrets.token_hex(8)
        outcome = await self._resolve(keys=[self._key(approval_id)], args=[status, chat_id, user_id, mac, answer])
        outcome = str(outcome)
        if outcome == "ok":
            await self._broadcast.publish(self.channel, {"id": approval_id})
            return "Approved." if approved else "Denied."
        if outcome == "missing":
            return f"No approval request {approval_id}."
        if outcome == "wrong_chat":
            return f"Approval request {approval_id} belongs to another chat."
        return f"Approval request {approval_id} is already {outcome}."

    async def _status(self, key: str, approval_id: str, chat_id: str) -> str:
        raw = await self._r.get(key)
        if raw is None:
            return "expired"
        try:
            data = json.loads(raw)
            status = str(data.get("status", "pending"))
        except (ValueError, AttributeError):
            log.warning("approval.tampered", approval_id=approval_id, reason="unreadable record")
            return "tampered"
        if status == "approved" and not self._seal.verify(data.get("mac"), "approval", approval_id, status, chat_id):
            log.warning("approval.tampered", approval_id=approval_id, reason="approval without a valid MAC")
            return "tampered"
        return status

    async def _finish(self, key: str, status: str) -> None:
        await self._resolve(keys=[key], args=[status, "", "system", "", ""])

    async def _on_message(self, data: dict[str, Any]) -> None:
        event = self._waiters.get(str(data.get("id")))
        if event is not None:
            event.set()
