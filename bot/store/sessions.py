"""Conversation history per session key, in Redis (DESIGN.md §4.5).

A session is a list of messages (JSON, one element each), a meta hash (counters, token
usage, timestamps, a version bumped on every history change), an optional compaction
summary, and the ids of recently applied writes. Every write is one Lua script: atomic,
and applied once even when redis-py retries it. Memory is bounded: at most
``max_messages`` are kept (compaction normally keeps far fewer) and an idle session
expires after ``ttl_s`` (refreshed on every write). A history read again is parsed only
where it changed (``DecodedHistories``).
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import structlog
from pydantic import BaseModel, ValidationError
from redis.asyncio.client import Pipeline

from agent.types import Message
from bot.store import session_scripts
from bot.store.keys import Keys
from bot.store.owned import OwnedKeys, queue_script
from bot.store.session_info import SessionInfo, SessionPage, SessionUsage, info_of, usage_of

log = structlog.get_logger(__name__)

DEFAULT_MAX_MESSAGES = 2000
DEFAULT_TTL_S = 90 * 86400
DEFAULT_OPS_BOUND = 128  # small enough for a compact listpack-encoded sorted set
# The decoded histories kept for the next read of their sessions: about this much memory
# at most, in at most this many sessions. An entry is reckoned at twice its stored JSON
# (the text is held twice) plus 512 bytes of objects: what tracemalloc counts for entries
# of 75 bytes, and a third more than it counts for entries of 800.
DECODED_MAX_MEMORY = 8 << 20
DECODED_MAX_SESSIONS = 256
_DECODED_ENTRY_COST = 512


class SessionSnapshot(BaseModel):
    """History, summary and version read together, for compare-and-replace (compaction)."""

    messages: list[Message]
    stored_count: int  # raw list length; differs from len(messages) only if entries were unreadable
    version: int
    summary: str | None


@dataclass(frozen=True, slots=True)
class SessionContext:
    """What a run reads first: history, summary and meta (model, usage, context warned)."""

    messages: list[Message]
    summary: str | None
    model: str | None
    usage: SessionUsage
    context_warned: bool


class SessionStore:
    """Reads and atomically changes sessions."""

    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        *,
        max_messages: int = DEFAULT_MAX_MESSAGES,
        ttl_s: int = DEFAULT_TTL_S,
        ops_bound: int = DEFAULT_OPS_BOUND,
    ) -> None:
        if max_messages < 1 or ttl_s < 1 or ops_bound < 1:
            raise ValueError("max_messages, ttl_s and ops_bound must be positive")
        self._client = client
        self._keys = keys
        self.max_messages = max_messages
        self.ttl_s = int(ttl_s)
        self.ops_bound = ops_bound
        self._append = client.register_script(session_scripts.APPEND)
        self._replace = client.register_script(session_scripts.REPLACE_AFTER_COMPACTION)
        self._reset = client.register_script(session_scripts.RESET)
        self._usage = client.register_script(session_scripts.RECORD_USAGE)
        self._run_usage = client.register_script(session_scripts.RECORD_RUN)
        self._record_run = client.register_script(session_scripts.RECORD_FINISHED_RUN)
        self._decoded = DecodedHistories()
        self._owned = OwnedKeys(client)

    async def append(self, session_key: str, run_id: str, messages: Sequence[Message]) -> bool:
        """Append a run's messages, all or nothing. False when this run id was already applied.

        One append per run: a second append with the same ``run_id`` is treated as a retry.
        A run that appends in steps uses a distinct id per step (e.g. ``f"{run_id}:1"``).
        """
        if not run_id:
            raise ValueError("append needs a non-empty run_id (it makes the write idempotent)")
        payload = [_encode(m) for m in messages]
        args = [*self._common(f"a:{run_id}", session_key), self.max_messages, *payload]
        applied = await self._append(keys=self._session_keys(session_key), args=args)
        return bool(applied)

    async def history(self, session_key: str) -> list[Message]:
        """All stored messages, oldest first. Unreadable entries are skipped and logged."""
        raw = await self._client.lrange(self._keys.session_messages(session_key), 0, -1)
        return self._decoded.decode(session_key, raw)

    async def context(self, session_key: str) -> SessionContext:
        """History, summary and meta, what a run's start needs, in one round trip."""
        return (await self.context_with(session_key, None))[0]

    async def context_with(
        self, session_key: str, also: Callable[[Pipeline], None] | None
    ) -> tuple[SessionContext, list[Any]]:
        """:meth:`context`, and in the same round trip what ``also`` queues (its replies)."""
        pipe = self._client.pipeline(transaction=False)
        read = self.queue_context(pipe, session_key)
        if also is not None:
            also(pipe)
        replies = await pipe.execute()
        return read(replies)(), replies[3:]

    def queue_context(self, pipe: Pipeline, session_key: str) -> Callable[[list[Any]], Callable[[], SessionContext]]:
        """:meth:`context`'s three reads queued on ``pipe``. The reader takes the replies from
        theirs on and gives what decodes them: the history's messages are parsed only when,
        and where, they are needed."""
        pipe.lrange(self._keys.session_messages(session_key), 0, -1)
        pipe.get(self._keys.session_summary(session_key))
        pipe.hgetall(self._keys.session_meta(session_key))

        def read(replies: list[Any]) -> Callable[[], SessionContext]:
            raw, summary, meta = replies[:3]
            return lambda: SessionContext(
                messages=self._decoded.decode(session_key, raw),
                summary=str(summary) if summary is not None else None,
                model=str(meta["model"]) if meta.get("model") else None,
                usage=usage_of(meta),
                context_warned=bool(meta.get("context_warned")),
            )
        return read

    async def record_run(
        self, session_key: str, run_id: str, messages: Sequence[Message], usages: Sequence[tuple[int, int]], *,
        price: Callable[[int, int], float | None] | None = None, rearm_warning: bool = False,
    ) -> tuple[int, int]:
        """In one script, each applied once: :meth:`append`, a :meth:`record_usage` per LLM
        call (``run_id:i``) and the run's :meth:`record_run_cost` (priced by ``price``),
        under the op ids those use; with ``rearm_warning``, the context warning cleared.
        Returns the stored message count and the compaction count after, what the
        compaction trigger needs."""
        pipe = self._client.pipeline(transaction=False)
        counts = self.queue_record_run(pipe, session_key, run_id, messages, usages, price=price,
                                       rearm_warning=rearm_warning)
        return counts(await pipe.execute())

    def queue_record_run(
        self, pipe: Pipeline, session_key: str, run_id: str, messages: Sequence[Message],
        usages: Sequence[tuple[int, int]], *, price: Callable[[int, int], float | None] | None = None,
        rearm_warning: bool = False,
    ) -> Callable[[Sequence[Any]], tuple[int, int]]:
        """:meth:`record_run` queued on ``pipe``, to travel in another step's round trip;
        returns what reads its two counts from that pipeline's replies."""
        if not run_id:
            raise ValueError("record_run needs a non-empty run_id (it makes the writes idempotent)")
        args: list[str | int | float] = [*self._common(run_id, session_key), self.max_messages, len(usages)]
        for prompt_tokens, completion_tokens in usages:
            _check_tokens(prompt_tokens, completion_tokens)
            args += [prompt_tokens, completion_tokens]
        if usages:
            prompt, completion = sum(p for p, _ in usages), sum(c for _, c in usages)
            cost = price(prompt, completion) if price else None
            args += _run_totals(prompt, completion, cost)
        args += [_encode(m) for m in messages]
        if rearm_warning:
            pipe.hdel(self._keys.session_meta(session_key), "context_warned")
        queue_script(pipe, self._record_run, self._session_keys(session_key), args)
        at = len(pipe) - 1
        return lambda replies: (int(replies[at][0]), int(replies[at][1]))

    async def snapshot(self, session_key: str) -> SessionSnapshot:
        """History, version and summary in one consistent read (MULTI/EXEC)."""
        pipe = self._client.pipeline(transaction=True)
        pipe.lrange(self._keys.session_messages(session_key), 0, -1)
        pipe.hget(self._keys.session_meta(session_key), "version")
        pipe.get(self._keys.session_summary(session_key))
        raw, version, summary = await pipe.execute()
        return SessionSnapshot(
            messages=self._decoded.decode(session_key, raw),
            stored_count=len(raw),
            version=int(version or 0),
            summary=summary,
        )

    async def summary(self, session_key: str) -> str | None:
        value = await self._client.get(self._keys.session_summary(session_key))
        return str(value) if value is not None else None

    async def compaction_count(self, session_key: str) -> int:
        return int(await self._client.hget(self._keys.session_meta(session_key), "compactions") or 0)

    async def replace_after_compaction(
        self,
        session_key: str,
        summary: str,
        keep: Sequence[Message],
        expected_len: int,
        *,
        expected_version: int | None = None,
    ) -> bool:
        """Store ``summary`` and make ``keep`` the whole history, atomically.

        Refuses (returns False, changes nothing) when the stored history no longer has
        ``expected_len`` entries or, if given, ``expected_version`` (from :meth:`snapshot`):
        a run appended meanwhile, and its messages must not be lost.
        """
        if not summary.strip():
            raise ValueError("a compaction summary must not be empty")
        if expected_len < 0:
            raise ValueError("expected_len must not be negative")
        version = "" if expected_version is None else str(int(expected_version))
        args = [
            *self._common(f"c:{uuid.uuid4().hex}", session_key),
            expected_len,
            version,
            summary,
            self.max_messages,
            *(_encode(m) for m in keep),
        ]
        return bool(await self._replace(keys=self._session_keys(session_key), args=args))

    async def reset(self, session_key: str) -> bool:
        """``/new``: clear history and summary, count the reset. False if there was no session."""
        args = self._common(f"r:{uuid.uuid4().hex}", session_key)
        return bool(await self._reset(keys=self._session_keys(session_key), args=args))

    async def record_usage(
        self, session_key: str, prompt_tokens: int, completion_tokens: int, *, run_id: str | None = None
    ) -> bool:
        """Record one LLM call's tokens (last and totals). With ``run_id``, applied once per run."""
        _check_tokens(prompt_tokens, completion_tokens)
        op = f"u:{run_id}" if run_id else f"u:{uuid.uuid4().hex}"
        args = [*self._common(op, session_key), prompt_tokens, completion_tokens]
        return bool(await self._usage(keys=self._session_keys(session_key), args=args))

    async def record_run_cost(
        self, session_key: str, run_id: str, prompt_tokens: int, completion_tokens: int, cost: float | None
    ) -> bool:
        """Record a whole run's tokens (``/usage``'s "last run") and add its cost, once per run."""
        args = self._run_cost_args(session_key, run_id, prompt_tokens, completion_tokens, cost)
        return bool(await self._run_usage(keys=self._session_keys(session_key), args=args))

    def _run_cost_args(
        self, session_key: str, run_id: str, prompt_tokens: int, completion_tokens: int, cost: float | None
    ) -> list[str | int | float]:
        return [*self._common(f"run:{run_id}", session_key), *_run_totals(prompt_tokens, completion_tokens, cost)]

    async def model(self, session_key: str) -> str | None:
        """The model this session switched to (``/model``), None for the default."""
        value = await self._client.hget(self._keys.session_meta(session_key), "model")
        return str(value) if value else None

    async def set_model(self, session_key: str, model_id: str) -> None:
        """Remember the session's model; it survives ``/new`` like the usage totals."""
        meta = self._keys.session_meta(session_key)
        pipe = self._client.pipeline(transaction=True)
        pipe.hset(meta, "model", model_id)
        pipe.expire(meta, self.ttl_s)
        await pipe.execute()

    async def note_context_warning(self, session_key: str, over: bool) -> bool:
        """Track the context warning: True when ``over`` is new (warn now), False when the
        chat was already warned or the context is below the line (which re-arms it)."""
        meta = self._keys.session_meta(session_key)
        if not over:
            await self._client.hdel(meta, "context_warned")
            return False
        # A token of this call's own: sent again after its reply was lost, it reads as new.
        return await self._owned.acquire_field(meta, "context_warned", uuid.uuid4().hex)

    async def usage(self, session_key: str) -> SessionUsage:
        meta = await self._client.hgetall(self._keys.session_meta(session_key))
        return usage_of(meta)

    async def show(self, session_key: str) -> SessionInfo:
        """Counters and usage of one session (``exists`` False when there is none)."""
        return (await self._infos([session_key]))[0]

    async def list_sessions(self, cursor: int = 0, limit: int = 50) -> SessionPage:
        """Sessions by last activity, newest first; pass ``next_cursor`` back for the next page."""
        if cursor < 0 or not 1 <= limit <= 1000:
            raise ValueError("cursor must be >= 0 and limit between 1 and 1000")
        index = self._keys.session_index()
        await self._client.zremrangebyscore(index, "-inf", f"({time.time() - self.ttl_s}")
        members = await self._client.zrevrange(index, cursor, cursor + limit)
        more = len(members) > limit
        infos = await self._infos([str(m) for m in members[:limit]])
        return SessionPage(sessions=infos, next_cursor=cursor + limit if more else None)

    def _session_keys(self, session_key: str) -> list[str]:
        k = self._keys
        return [
            k.session_messages(session_key),
            k.session_meta(session_key),
            k.session_ops(session_key),
            k.session_summary(session_key),
            k.session_index(),
        ]

    def _common(self, op: str, session_key: str) -> list[str | int | float]:
        if not session_key:
            raise ValueError("session_key must not be empty")
        return [op, repr(time.time()), self.ttl_s, self.ops_bound, session_key]

    async def _infos(self, session_keys: list[str]) -> list[SessionInfo]:
        if not session_keys:
            return []
        pipe = self._client.pipeline(transaction=False)
        for sk in session_keys:
            pipe.llen(self._keys.session_messages(sk))
            pipe.hgetall(self._keys.session_meta(sk))
            pipe.exists(self._keys.session_summary(sk))
        replies = await pipe.execute()
        infos = []
        for i, sk in enumerate(session_keys):
            count, meta, has_summary = replies[3 * i : 3 * i + 3]
            infos.append(info_of(sk, int(count), meta, bool(has_summary)))
        return infos


def _check_tokens(prompt_tokens: int, completion_tokens: int) -> None:
    for name, value in (("prompt_tokens", prompt_tokens), ("completion_tokens", completion_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def _run_totals(prompt_tokens: int, completion_tokens: int, cost: float | None) -> list[str | int | float]:
    if min(prompt_tokens, completion_tokens) < 0 or (cost is not None and cost < 0):
        raise ValueError("run usage must not be negative")
    return [prompt_tokens, completion_tokens, "" if cost is None else repr(float(cost))]


def _encode(message: Message) -> str:
    if not isinstance(message, Message):
        raise TypeError(f"sessions store agent.types.Message objects, got {type(message).__name__}")
    return message.model_dump_json(exclude_defaults=True)


class DecodedHistories:
    """The last read history of recently read sessions, each message decoded beside the
    stored JSON it came from. A session is read whole at every run's start, and all but
    the last run's messages are the same bytes as last time: those are not parsed again.
    Only equal bytes are reused (the same bytes make the same message), so nothing the
    store says is trusted and nothing needs invalidating; a trimmed or compacted history
    simply decodes what it no longer shares. Bounded in memory and sessions (LRU)."""

    def __init__(self, max_memory: int = DECODED_MAX_MEMORY, max_sessions: int = DECODED_MAX_SESSIONS) -> None:
        self._max_memory = max_memory
        self._max_sessions = max_sessions
        self._memory = 0
        # session key -> (stored JSON, its messages; None where it did not decode), their memory
        self._kept: OrderedDict[str, tuple[list[str | bytes], list[Message | None], int]] = OrderedDict()

    def decode(self, session_key: str, raw: Sequence[str | bytes]) -> list[Message]:
        """The messages of ``raw``, oldest first; unreadable entries are skipped and logged."""
        kept = self._kept.pop(session_key, None)
        if kept is not None:
            self._memory -= kept[2]
        seen, known, _ = kept or ((), (), 0)
        start = _alignment(seen, raw)
        messages: list[Message | None] = []
        for position, item in enumerate(raw):
            at = start + position
            message = known[at] if at < len(seen) and seen[at] == item else None
            if message is None:
                try:
                    message = Message.model_validate_json(item)
                except ValidationError as exc:
                    log.warning("store.session.unreadable_message", session_key=session_key, position=position,
                                error=str(exc).splitlines()[0])
            messages.append(message)
        memory = 2 * sum(map(len, raw)) + _DECODED_ENTRY_COST * len(raw)
        if raw and memory <= self._max_memory:
            self._kept[session_key] = (list(raw), messages, memory)
            self._memory += memory
            while self._memory > self._max_memory or len(self._kept) > self._max_sessions:
                self._memory -= self._kept.popitem(last=False)[1][2]
        return [m for m in messages if m is not None]


def _alignment(seen: Sequence[str | bytes], raw: Sequence[str | bytes]) -> int:
    """Where ``raw`` starts in ``seen``: 0 unless its first entries were trimmed since."""
    if not seen or not raw or seen[0] == raw[0]:
        return 0
    first = raw[0]
    return next((i for i in range(1, len(seen)) if seen[i] == first), 0)
