"""Per-session inboxes in Redis.

A message waits in ``inbox:<session>``; when a worker takes it, it moves to
``running:<session>`` and stays there until its run is recorded, so a replica that
dies mid-run leaves the work for whoever takes the session lock next (at-least-once
runs; delivery is de-duplicated separately). ``pending`` indexes every session with
work, so sweepers on any replica can find sessions nobody is serving.

Inbound dedupe (DESIGN.md §5) lives here too, so the gateway owns it whole: Telegram
update ids, Slack posts (the message/app_mention twins of one post and Slack's retries
share one key) and button presses are handled once. An ordinary message is marked in
the same atomic step that enqueues it (``Inbox.enqueue``); a control command or a
pairing challenge, which is never queued, is marked by :class:`Deduper`. Platforms
redeliver (Slack retries unanswered events, a restarted poller may see an update twice).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import secrets
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from agent.types import RunRequest
from bot.store.keys import Keys
from bot.store.locks import Lease
from bot.store.owned import OwnedKeys, RideAlong, execute_with, queue_script, ttl_ms

_ENQUEUE = """
if not redis.call('SET', KEYS[4], '1', 'NX', 'EX', ARGV[6]) then
  return false
end
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[3], 'NX', ARGV[3], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
local dropped = {}
local cap = tonumber(ARGV[2])
while redis.call('LLEN', KEYS[1]) > cap do
  table.insert(dropped, redis.call('LPOP', KEYS[1]))
end
return dropped
"""

# KEYS[3] counts what this take moved (for ARGV[2] ms): sent again after its reply was
# lost, the take hands over the running list's tail it moved, rather than the inbox it
# emptied (whose messages would then be lost). Only the lock holder adds to that list.
_TAKE = """
local moved = tonumber(redis.call('GET', KEYS[3]) or '0')
if moved > 0 then
  return redis.call('LRANGE', KEYS[2], -moved, -1)
end
local items = redis.call('LRANGE', KEYS[1], 0, -1)
if #items > 0 then
  redis.call('RPUSH', KEYS[2], unpack(items))
  redis.call('DEL', KEYS[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
  redis.call('SET', KEYS[3], #items, 'PX', ARGV[2])
end
return items
"""

# A worker's next batch: what a previous holder left running (resumed), else everything
# waiting; with the server's clock, the run's start as every replica sees it. With a lock
# key (KEYS[3]), only while the lock holds the token ARGV[2] (queued after taking it).
_CLAIM = """
if KEYS[3] and redis.call('GET', KEYS[3]) ~= ARGV[2] then
  return false
end
local now = redis.call('TIME')
local running = redis.call('LRANGE', KEYS[2], 0, -1)
if #running > 0 then
  return {1, running, now[1], now[2]}
end
local items = redis.call('LRANGE', KEYS[1], 0, -1)
if #items > 0 then
  redis.call('RPUSH', KEYS[2], unpack(items))
  redis.call('DEL', KEYS[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
end
return {0, items, now[1], now[2]}
"""

# Forget the running batch (and its saved result, KEYS[4] unless ''); when nothing waits,
# drop the session from pending and release its lock (KEYS[5], if it holds ARGV[2]) in the
# same step, so a message arriving after it finds the lock free and is served anew.
# 1: more waiting; 0: none; 2: none, and the lock is not held any more. With a lock that
# does not hold ARGV[2], nothing is touched and the answer is 2: the step was sent again
# after its first run released the lock (its reply lost), and whoever holds the lock now
# owns the running list; or the lock expired, and the batch is left for a resume.
_FINISH = """
if KEYS[5] and redis.call('GET', KEYS[5]) ~= ARGV[2] then
  return 2
end
redis.call('DEL', KEYS[1])
if KEYS[4] and KEYS[4] ~= '' then redis.call('DEL', KEYS[4]) end
if redis.call('LLEN', KEYS[2]) > 0 then
  return 1
end
redis.call('ZREM', KEYS[3], ARGV[1])
if KEYS[5] then
  redis.call('DEL', KEYS[5])
  return 2
end
return 0
"""

_KEEP_MS = 7 * 24 * 3600 * 1000
# How long a take's record outlives it: longer than redis-py's retries of one request.
TAKEN_KEEP_MS = 120_000

DEDUPE_TTL_S = 86400.0
RUN_MARK_TTL_S = 600.0  # far longer than redis-py's retries of one request
# A command's mark while it is being handled: longer than the slowest command (/new waits
# up to 12 s), short enough that after a crash the platform's next retry runs it.
PENDING_TTL_S = 60.0
PENDING = "pending:"
DONE = "done"

DedupeStatus = Literal["first", "duplicate", "in_flight"]


@dataclass(frozen=True)
class DedupeClaim:
    """The answer to "have we seen this inbound event?"; ``first`` holds the mark."""

    status: DedupeStatus
    key: str
    token: str


class Deduper:
    """Inbound dedupe for what is never queued (control commands, pairing challenges).

    Two stages, so a platform retry arriving while the first delivery is still being
    handled is not acknowledged as a duplicate of something that may yet fail: the mark
    is taken as ``pending:<token>`` (``in_flight`` to a retry: not accepted, try later),
    then ``confirm`` makes it ``done`` for 24 h, or ``release`` deletes it when the
    handling failed so the retry runs it.
    """

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys
        self._owned = OwnedKeys(client)

    async def claim(self, key: str, pending_ttl_s: float = PENDING_TTL_S) -> DedupeClaim:
        full, token = self._keys.dedupe(key), PENDING + uuid.uuid4().hex
        # Set only if absent; the fresh token makes a client retry of this call idempotent.
        if await self._owned.acquire(full, token, pending_ttl_s):
            return DedupeClaim("first", full, token)
        held = await self._client.get(full)
        pending = held is None or (held.decode() if isinstance(held, bytes) else str(held)).startswith(PENDING)
        return DedupeClaim("in_flight" if pending else "duplicate", full, token)

    async def confirm(self, claim: DedupeClaim, ttl_s: float = DEDUPE_TTL_S) -> None:
        """The event was handled: later deliveries are duplicates for ``ttl_s``."""
        await self._client.set(claim.key, DONE, px=ttl_ms(ttl_s))

    async def release(self, claim: DedupeClaim) -> None:
        """The handling failed: drop the mark (if still ours) so the redelivery is taken."""
        await self._owned.delete_if_owner(claim.key, claim.token)


@dataclass
class EnqueueResult:
    dropped: list[RunRequest]
    duplicate: bool = False


@dataclass
class Claim:
    batch: list[RunRequest]
    resumed: bool  # left running by a holder that never finished it
    server_time: float  # Redis' clock at the claim
    ahead: Any = None  # what reads queued with the claim found (``enqueue_and_claim``)


# Reads to queue on the claim's pipeline; the reader it returns is handed their replies.
ReadAhead = Callable[[Pipeline], Callable[[list[Any]], Any]]


class Inbox:
    """The Redis side of queueing: enqueue, take, finish, and finding stranded work."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._r = client
        self._keys = Keys(prefix)
        self._take_ids = _op_ids()
        self._enqueue = client.register_script(_ENQUEUE)
        self._take = client.register_script(_TAKE)
        self._claim = client.register_script(_CLAIM)
        self._finish = client.register_script(_FINISH)

    def _inbox(self, session_key: str) -> str:
        return self._keys.inbox(session_key)

    def _running(self, session_key: str) -> str:
        return self._keys.running(session_key)

    @property
    def _pending(self) -> str:
        return self._keys.pending()

    async def enqueue(self, req: RunRequest, cap: int, *, dedupe_key: str | None = None) -> EnqueueResult:
        """Append ``req`` unless ``dedupe_key`` was seen in the last 24 h (one atomic step,
        so a failed enqueue never leaves the key behind to swallow the platform's retry).
        When the inbox passes ``cap`` the oldest entries are dropped and returned."""
        keys, args = self._enqueue_call(req, cap, dedupe_key)
        return _enqueued(await self._enqueue(keys=keys, args=args))

    async def enqueue_and_claim(
        self, req: RunRequest, cap: int, lock: Lease, *, dedupe_key: str | None = None,
        ahead: ReadAhead | None = None,
    ) -> tuple[EnqueueResult, Claim | None]:
        """:meth:`enqueue`, and in the same round trip :meth:`lock_and_claim` right after
        it: a message for an idle session reaches its worker with its batch in hand. The
        claim is None when another worker holds the lock (the message then waits for it as
        :meth:`enqueue` leaves it). With the lock taken, the claim is the worker's to run
        or finish even when the message was a duplicate (it may hold earlier ones).
        ``ahead`` queues reads after the claim; what its reader makes of their replies is
        the claim's ``ahead`` (read only when the claim was taken)."""
        keys, args = self._enqueue_call(req, cap, dedupe_key)
        read: Callable[[list[Any]], Any] | None = None

        def queue(pipe: Pipeline, token: str) -> None:
            nonlocal read
            queue_script(pipe, self._enqueue, keys, args)
            self._queue_claim(pipe, req.session_key, lock, token)
            if ahead is not None:
                read = ahead(pipe)

        taken, (enqueued, claimed, *more) = await lock.acquire_with(queue)
        if taken and claimed is None:  # the lock was gone again before the claim: not ours to keep
            await lock.release()
            taken = False
        if not taken:
            return _enqueued(enqueued), None
        claim = _claim_of(claimed)
        if read is not None:
            claim.ahead = read(more)
        return _enqueued(enqueued), claim

    def _enqueue_call(self, req: RunRequest, cap: int, dedupe_key: str | None) -> tuple[list[str], list[Any]]:
        """The enqueue script's keys and arguments. A message without a dedupe key (the
        console's, a heartbeat's run-now) is marked by its run id for a while: an enqueue
        redis-py sends again after its reply was lost, perhaps once the message was
        answered, is then a duplicate instead of the message a second time."""
        if dedupe_key:
            mark, ttl_s = self._keys.dedupe(dedupe_key), DEDUPE_TTL_S
        else:
            mark, ttl_s = self._keys.run_mark(req.run_id), RUN_MARK_TTL_S
        return (
            [self._inbox(req.session_key), self._running(req.session_key), self._pending, mark],
            [req.model_dump_json(), cap, time.time(), req.session_key, _KEEP_MS, int(ttl_s)],
        )

    async def take(self, session_key: str) -> list[RunRequest]:
        """Move everything waiting into the running list and return it (oldest first)."""
        return taken(await self._take(keys=self._take_keys(session_key), args=[_KEEP_MS, TAKEN_KEEP_MS]))

    def _take_keys(self, session_key: str) -> list[str]:
        """The take script's keys; the last one is this take's own."""
        return [self._inbox(session_key), self._running(session_key), self._keys.taken(next(self._take_ids))]

    async def claim(self, session_key: str) -> Claim:
        """The batch to run next: the running batch a previous holder never finished
        (resumed), else everything waiting (moved to running). One step."""
        return _claim_of(await self._claim(keys=[self._inbox(session_key), self._running(session_key)], args=[_KEEP_MS]))

    async def lock_and_claim(self, session_key: str, lock: Lease) -> Claim | None:
        """Take the session's ``lock`` (without waiting) and :meth:`claim`, in one round
        trip; None when another worker holds the lock."""
        replies = await lock.acquire_then(lambda pipe, token: self._queue_claim(pipe, session_key, lock, token))
        return None if replies is None else _claim_of(replies[0])

    def _queue_claim(self, pipe: Pipeline, session_key: str, lock: Lease, token: str) -> None:
        """:meth:`claim` queued on ``pipe``, only while ``lock`` holds ``token``."""
        queue_script(pipe, self._claim, [self._inbox(session_key), self._running(session_key), lock.key],
                     [_KEEP_MS, token])

    async def take_reading(self, session_key: str, other_key: str) -> tuple[list[RunRequest], str | bytes | None]:
        """``take``, and the value of ``other_key`` read in the same round trip."""
        pipe = self._r.pipeline(transaction=False)
        pipe.get(other_key)
        self.queue_take(pipe, session_key)
        value, raw = await pipe.execute()
        return taken(raw), value

    def queue_take(self, pipe: Pipeline, session_key: str) -> None:
        """:meth:`take` queued on ``pipe``; read its reply with :func:`taken`."""
        queue_script(pipe, self._take, self._take_keys(session_key), [_KEEP_MS, TAKEN_KEEP_MS])

    async def running(self, session_key: str) -> list[RunRequest]:
        """Work a previous holder took but never finished (it died or lost its lock)."""
        return taken(await self._r.lrange(self._running(session_key), 0, -1))

    async def finish(
        self, session_key: str, run_id: str | None = None, *, lock: Lease | None = None, also: RideAlong | None = None
    ) -> bool:
        """Forget the running batch, and with ``run_id`` the result it saved for a retry
        (kept a week otherwise, for nothing); True when more messages are already waiting.
        With the session's ``lock``, release it in the same step when none are (the lock
        then reads as not held); else it stays held for the next batch. ``also``'s writes
        travel in the same round trip."""
        keys = [self._running(session_key), self._inbox(session_key), self._pending,
                self._keys.result(run_id) if run_id else ""]
        token = lock.token if lock is not None else None
        if lock is not None and token is not None:
            keys.append(lock.key)
        args = [session_key, token or ""]
        # A renewal racing the delete waits for this step rather than call the lock lost.
        step = lock.releasing() if lock is not None and token is not None else contextlib.nullcontext()
        async with step:
            if also is None:
                state = await self._finish(keys=keys, args=args)
            else:
                pipe = self._r.pipeline(transaction=False)
                queue_script(pipe, self._finish, keys, args)
                state = (await execute_with(pipe, also))[0]
            if state == 2 and lock is not None:  # the lock is not ours any more
                lock.forget()
        return state == 1

    async def peek(self, session_key: str) -> RunRequest | None:
        raw = await self._r.lindex(self._inbox(session_key), 0)
        return RunRequest.model_validate_json(raw) if raw else None

    async def waiting(self, session_key: str) -> int:
        return int(await self._r.llen(self._inbox(session_key)))

    async def clear(self, session_key: str) -> list[RunRequest]:
        """Empty the inbox (``/stopall``); the running batch is left to its run."""
        pipe = self._r.pipeline(transaction=True)
        pipe.lrange(self._inbox(session_key), 0, -1)
        pipe.delete(self._inbox(session_key))
        raw, _ = await pipe.execute()
        return taken(raw)

    async def pending_sessions(self, older_than_s: float = 0.0, limit: int = 100) -> list[str]:
        """Sessions that have had work waiting for at least ``older_than_s`` seconds."""
        cutoff = time.time() - older_than_s
        keys = await self._r.zrangebyscore(self._pending, "-inf", cutoff, start=0, num=limit)
        return [str(k) for k in keys]

    async def depth(self) -> int:
        return int(await self._r.zcard(self._pending))

    async def pending_with_depth(self, older_than_s: float, limit: int = 100) -> tuple[list[str], int]:
        """``pending_sessions`` and ``depth`` in one round trip (the sweeper asks both every second)."""
        pipe = self._r.pipeline(transaction=False)
        pipe.zrangebyscore(self._pending, "-inf", time.time() - older_than_s, start=0, num=limit)
        pipe.zcard(self._pending)
        keys, depth = await pipe.execute()
        return [str(k) for k in keys], int(depth)


def _op_ids() -> Iterator[str]:
    """Ids unique to each request of this process (a random prefix, then a count)."""
    prefix = secrets.token_hex(8)
    return (f"{prefix}:{n}" for n in itertools.count())


def _enqueued(raw: Sequence[str | bytes] | None) -> EnqueueResult:
    """The enqueue script's reply: nil for a duplicate, else what the cap pushed out."""
    if raw is None:
        return EnqueueResult(dropped=[], duplicate=True)
    return EnqueueResult(dropped=[RunRequest.model_validate_json(item) for item in raw])


def taken(raw: Sequence[str | bytes] | None) -> list[RunRequest]:
    """The requests a take (or claim) moved to running, from the script's reply."""
    return [RunRequest.model_validate_json(item) for item in raw or []]


def _claim_of(reply: list[Any]) -> Claim:
    resumed, raw, sec, usec = reply
    return Claim(
        batch=taken(raw),
        resumed=bool(resumed),
        server_time=float(sec) + float(usec) / 1_000_000,
    )


def describe(req: RunRequest, limit: int = 60) -> str:
    """A short quote of a message for notices ("dropped: …")."""
    text = " ".join(req.text.split())
    quoted = json.dumps(text if len(text) <= limit else text[: limit - 1] + "…", ensure_ascii=False)
    if not req.attachments:
        return quoted
    files = f"{len(req.attachments)} file" + ("s" if len(req.attachments) > 1 else "")
    return f"{quoted} with {files}" if text else files
