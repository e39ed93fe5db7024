"""DM pairing (``dm_policy: pairing``): a stranger's DM gets a short code, the owner approves it.

A user who is not in ``allow_from`` and writes to the bot in a DM gets a code, and no LLM
call is made. ``botd pairing approve CODE`` adds the user to the approved users of that
channel (kept in Redis, so across restarts); from then on they count as allowed wherever
``allow_from`` is checked. The rules that keep a flood of strangers cheap:

* a user has one live code at a time: writing again repeats it, never a new one;
* a code lives :data:`CODE_TTL_S` (1 h), then the next DM gets a new one;
* at most :data:`MAX_REPLIES_PER_HOUR` code replies per user per hour, then silence;
* at most :data:`MAX_PENDING` live codes in all: beyond that strangers get nothing;
* a denied user gets no reply and no new code until the denied code would have expired.

Expiry is decided by the injected clock against the expiry stored with the code (Redis
TTLs only collect garbage), so tests can move time. Keys: :mod:`bot.store.keys`.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import redis.asyncio as aioredis
import structlog
from pydantic import BaseModel, ValidationError

from bot.gateway.inbox import Deduper
from bot.store.keys import Keys
from bot.store.owned import OwnedKeys, shared_script
from channels.base import ChannelAdapter, Target

log = structlog.get_logger(__name__)

# No 0/O, 1/I/L: a code read aloud or off a phone screen is typed right the first time.
ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 8
CODE_TTL_S = 3600.0
MAX_REPLIES_PER_HOUR = 3
MAX_PENDING = 100
DENIED = "-"
GC_MARGIN_S = 600  # Redis TTLs outlive the clock's expiry a little: the clock decides

M = TypeVar("M", bound=BaseModel)

# One code reply within the hour's budget (ARGV[2]), counted by its id (ARGV[1]): 1 when it
# may be sent. Sent again after its reply was lost, it finds its id and is still allowed;
# the set never holds more than the budget, however many messages a stranger sends.
_COUNT_REPLY = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""

APPROVED_TEXT = "You're approved: you can talk to me now."


def code_reply(code: str) -> str:
    return (
        "Hi! I only talk with people my owner has approved.\n"
        f"Your pairing code: {code}\n"
        f"Ask the owner to run: botd pairing approve {code}\n"
        "The code is valid for one hour."
    )


def normalize_code(text: str) -> str:
    """What the owner typed, as stored: case, spaces and dashes do not matter."""
    return "".join(ch for ch in text.upper() if ch not in " -\t")


def printable(text: str) -> str:
    """A stranger chose this name; it reaches the owner's terminal without control characters."""
    return "".join(ch if ch.isprintable() else " " for ch in text)


def new_code() -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(CODE_LENGTH))


class PairingRequest(BaseModel):
    code: str
    channel: str
    user_id: str
    user_name: str = ""
    chat_id: str
    created_at: float
    expires_at: float


class ApprovedUser(BaseModel):
    channel: str
    user_id: str
    user_name: str = ""
    code: str = ""
    approved_at: float


@dataclass(frozen=True)
class Challenge:
    """The code of a stranger's DM, and whether to answer it (the reply budget allows)."""

    code: str | None
    reply: bool


class PairingStore:
    def __init__(self, client: aioredis.Redis, keys: Keys, clock: Callable[[], float] = time.time) -> None:
        self._r = client
        self._keys = keys
        self._clock = clock
        # Set-if-absent that reads as made when it already holds the same value: redis-py
        # sends a write again when its reply was lost, and the retry must not be a collision.
        self._owned = OwnedKeys(client)
        self._count_reply = shared_script(client, _COUNT_REPLY)

    # ---- the stranger's side ----------------------------------------------------------

    async def challenge(self, channel: str, user_id: str, user_name: str, chat_id: str) -> Challenge:
        """The user's live code (made now if none lives), and whether to send it again."""
        now = self._clock()
        user_key = self._keys.pairing_user(channel, user_id)
        raw = await self._r.get(user_key)
        held = str(raw) if raw is not None else None
        if held == DENIED:
            return Challenge(None, reply=False)
        request = await self._load(held) if held else None
        if request is None or request.expires_at <= now or (request.channel, request.user_id) != (channel, user_id):
            request = await self._issue(channel, user_id, user_name, chat_id, stale=held, now=now)
            if request is None:
                return Challenge(None, reply=False)
        replied = self._keys.pairing_replied(channel, user_id, str(int(now // 3600)))
        reply = await self._count_reply(keys=[replied], args=[uuid.uuid4().hex, MAX_REPLIES_PER_HOUR, 2 * 3600])
        return Challenge(request.code, reply=bool(reply))

    async def _issue(
        self, channel: str, user_id: str, user_name: str, chat_id: str, *, stale: str | None, now: float
    ) -> PairingRequest | None:
        if stale:
            await self._drop(stale)
            await self._r.delete(self._keys.pairing_user(channel, user_id))
        if await self._r.zcount(self._keys.pairing_pending(), f"({now}", "+inf") >= MAX_PENDING:
            log.warning("pairing.too_many_pending", channel=channel, user_id=user_id)
            return None
        request = PairingRequest(
            code=new_code(), channel=channel, user_id=user_id, user_name=printable(user_name)[:100], chat_id=chat_id,
            created_at=now, expires_at=now + CODE_TTL_S,
        )
        ttl = int(CODE_TTL_S) + GC_MARGIN_S
        # The record is written before the user's claim, so a claim always points at a
        # record; of two DMs racing on two replicas one claim wins and both repeat its code.
        if not await self._owned.acquire(self._keys.pairing_code(request.code), request.model_dump_json(), ttl):
            return None  # a collision in 31^8 codes: stay silent this once
        if not await self._owned.acquire(self._keys.pairing_user(channel, user_id), request.code, ttl):
            await self._r.delete(self._keys.pairing_code(request.code))
            winner = await self._r.get(self._keys.pairing_user(channel, user_id))
            return await self._load(str(winner)) if winner and winner != DENIED else None
        await self._r.zadd(self._keys.pairing_pending(), {request.code: request.expires_at})
        log.info("pairing.code_issued", channel=channel, user_id=user_id)
        return request

    async def is_approved(self, channel: str, user_id: str) -> bool:
        return bool(user_id) and bool(await self._r.hexists(self._keys.pairing_approved(channel), user_id))

    # ---- the owner's side -------------------------------------------------------------

    async def pending(self) -> list[PairingRequest]:
        """Live codes, oldest first; expired ones are swept on the way."""
        now = self._clock()
        await self._r.zremrangebyscore(self._keys.pairing_pending(), "-inf", now)
        codes = await self._r.zrange(self._keys.pairing_pending(), 0, -1)
        found = [await self._load(str(code)) for code in codes]
        return sorted((r for r in found if r is not None and r.expires_at > now), key=lambda r: r.created_at)

    async def approved(self, channel: str) -> list[ApprovedUser]:
        raw = await self._r.hgetall(self._keys.pairing_approved(channel))
        users = [_parse(ApprovedUser, value) for value in raw.values()]
        return sorted((u for u in users if u is not None), key=lambda u: u.approved_at)

    async def approve(self, code: str) -> PairingRequest | None:
        """Approve a live code; None when there is none (expired, denied, never issued)."""
        request = await self._live(code)
        if request is None:
            return None
        user = ApprovedUser(
            channel=request.channel, user_id=request.user_id, user_name=request.user_name,
            code=request.code, approved_at=self._clock(),
        )
        # The approval is written before the code goes: a crash between leaves a stale code.
        await self._r.hset(self._keys.pairing_approved(request.channel), request.user_id, user.model_dump_json())
        await self._drop(request.code)
        await self._r.delete(self._keys.pairing_user(request.channel, request.user_id))
        log.info("pairing.approved", channel=request.channel, user_id=request.user_id)
        return request

    async def deny(self, code: str) -> PairingRequest | None:
        """Drop a live code; its user gets no reply and no new code until it would have expired."""
        request = await self._live(code)
        if request is None:
            return None
        left = max(1, int(request.expires_at - self._clock()))
        await self._r.set(self._keys.pairing_user(request.channel, request.user_id), DENIED, ex=left)
        await self._drop(request.code)
        log.info("pairing.denied", channel=request.channel, user_id=request.user_id)
        return request

    async def revoke(self, channel: str, user_id: str) -> bool:
        return bool(await self._r.hdel(self._keys.pairing_approved(channel), user_id))

    # ---- helpers ----------------------------------------------------------------------

    async def _live(self, code: str) -> PairingRequest | None:
        code = normalize_code(code)
        if len(code) != CODE_LENGTH or any(ch not in ALPHABET for ch in code):
            return None
        request = await self._load(code)
        if request is None or request.expires_at <= self._clock():
            return None
        return request

    async def _load(self, code: str) -> PairingRequest | None:
        return _parse(PairingRequest, await self._r.get(self._keys.pairing_code(code)))

    async def _drop(self, code: str) -> None:
        await self._r.delete(self._keys.pairing_code(code))
        await self._r.zrem(self._keys.pairing_pending(), code)


def _parse(model: type[M], raw: str | bytes | None) -> M | None:
    if raw is None:
        return None
    try:
        return model.model_validate_json(raw)
    except ValidationError:
        log.warning("pairing.bad_record", model=model.__name__)
        return None


class ChannelPairing:
    """The :class:`channels.base.PairingGate` of one channel: answers a stranger with a code."""

    def __init__(
        self, store: PairingStore, channel: str, adapters: Mapping[str, ChannelAdapter], dedupe: Deduper
    ) -> None:
        self._store = store
        self._channel = channel
        self._adapters = adapters
        self._dedupe = dedupe  # the gateway's: a redelivered post is answered once

    async def is_approved(self, user_id: str) -> bool:
        return await self._store.is_approved(self._channel, user_id)

    async def challenge(self, user_id: str, user_name: str, chat_id: str, *, dedupe_key: str | None = None) -> bool:
        """Best effort: a failure is logged, never raised into the channel's intake. False when
        ``dedupe_key``'s post was answered before (a platform retry or twin); a store that is
        down for that check raises, so the platform delivers the post again."""
        if dedupe_key is not None:
            claim = await self._dedupe.claim(dedupe_key)
            if claim.status != "first":
                return False
            await self._dedupe.confirm(claim)  # before the reply: a retry never sends a second code
        try:
            answer = await self._store.challenge(self._channel, user_id, user_name, chat_id)
            if answer.code is None or not answer.reply:
                log.info("pairing.silent", channel=self._channel, user_id=user_id)
                return True
            adapter = self._adapters.get(self._channel)
            if adapter is not None:
                await adapter.send_text(Target(self._channel, chat_id, user_id=user_id), code_reply(answer.code))
        except Exception as exc:
            log.warning("pairing.challenge_failed", channel=self._channel, user_id=user_id, error=str(exc))
        return True


class ApprovalNotices:
    """Tells an approved user in their chat (the CLI publishes; one replica sends)."""

    def __init__(self, client: aioredis.Redis, keys: Keys, adapters: Mapping[str, ChannelAdapter]) -> None:
        self._r = client
        self._keys = keys
        self._adapters = adapters
        self._owned = OwnedKeys(client)

    async def publish(self, request: PairingRequest) -> int:
        """Returns how many daemons heard it (0: nobody will tell the user)."""
        return int(await self._r.publish(self._keys.pairing_events(), request.model_dump_json()))

    async def on_event(self, data: dict[str, Any]) -> None:
        request = PairingRequest.model_validate(data)
        adapter = self._adapters.get(request.channel)
        if adapter is None:
            return
        # A token of this call's own: another replica's claim is not ours, a retry of ours is.
        if not await self._owned.acquire(self._keys.pairing_notified(request.code), secrets.token_hex(8), 86400):
            return
        try:
            await adapter.send_text(Target(request.channel, request.chat_id, user_id=request.user_id), APPROVED_TEXT)
        except Exception as exc:
            log.warning("pairing.notice_failed", channel=request.channel, user_id=request.user_id, error=str(exc))



# ---- botd pairing list | approve CODE | deny CODE | revoke CHANNEL USER ----------------------


async def run_cli(client: aioredis.Redis, keys: Keys, args: argparse.Namespace, channels: list[str]) -> int:
    store = PairingStore(client, keys)
    if args.pairing_command == "list":
        pending = await store.pending()
        approved = [user for channel in channels for user in await store.approved(channel)]
        if args.json:
            print(json.dumps({
                "pending": [json.loads(r.model_dump_json()) for r in pending],
                "approved": [json.loads(u.model_dump_json()) for u in approved],
            }, ensure_ascii=False, indent=2))
            return 0
        print(_table(pending, approved))
        return 0
    if args.pairing_command == "revoke":
        if not await store.revoke(args.channel, args.user_id):
            print(f"botd pairing: {args.channel} user {args.user_id} is not approved", file=sys.stderr)
            return 1
        print(f"revoked {args.channel} user {args.user_id}")
        return 0
    approve = args.pairing_command == "approve"
    request = await (store.approve(args.code) if approve else store.deny(args.code))
    if request is None:
        print(f"botd pairing: no live code {args.code!r} (expired, already used, or never issued)", file=sys.stderr)
        return 1
    who = f"{request.channel} user {request.user_id}" + (f" ({request.user_name})" if request.user_name else "")
    if not approve:
        print(f"denied {who}")
        return 0
    heard = await ApprovalNotices(client, keys, {}).publish(request)
    print(f"approved {who}" + ("" if heard else " — no botd is running to tell them; they can write now"))
    return 0


def _table(pending: list[PairingRequest], approved: list[ApprovedUser]) -> str:
    now = time.time()
    lines = ["Pending codes:" if pending else "No pending codes."]
    for r in pending:
        minutes = max(0, int((r.expires_at - now) // 60))
        lines.append(f"  {r.code}  {r.channel:<8}  {r.user_id:<14}  {r.user_name[:30]:<30}  expires in {minutes} min")
    lines.append("Approved users:" if approved else "No approved users.")
    for u in approved:
        when = datetime.fromtimestamp(u.approved_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
        lines.append(f"  {u.channel:<8}  {u.user_id:<14}  {u.user_name[:30]:<30}  since {when}")
    return "\n".join(lines)
