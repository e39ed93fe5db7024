"""The outbound half of a run: live previews, then exactly-once delivery of the final text.

What a preview may show: the final text goes through sanitize and the silent checks; a
preview must be at least as careful while the text is incomplete: a reply that is, or
may still become, NO_REPLY / HEARTBEAT_OK shows nothing, and an unclosed thinking block
or a half-written tag is cut off.

Idempotent delivery: each reply part (and each file ``send_file`` sends) is claimed in
Redis before the send and marked sent after it, so a retried run never sends a part twice.
A replica dying between claim and send loses that part rather than duplicating it: parts
are at-most-once, which is what a chat reader prefers. Whole results are stored before
delivery, so a retried run re-delivers the same text instead of asking the model again.

A claim the store applied but whose reply was lost (it stopped, or the connection
dropped, before answering) is not a part lost: the claim holds a token, redis-py's retry
of the same step reads it as ours, and a claim that failed so keeps its token in this
process, for the run's resume to claim the part again (nothing was sent for it).
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
import structlog
from redis.asyncio.client import Pipeline

from agent.sanitize import heartbeat_reply, is_silent_chat, is_silent_cron, sanitize
from agent.types import DeliveryStatus, RunKind, RunResult
from bot import metrics
from bot.store.keys import Keys
from bot.store.owned import OwnedKeys, RideAlong, execute_with
from channels.base import ChannelAdapter, DeliveryUnknown, ReplyStream, Target, ToolActivity

if TYPE_CHECKING:
    from bot.gateway.redelivery import Redelivery

log = structlog.get_logger(__name__)

_TTL_S = 7 * 24 * 3600
SENDING = "sending:"
# Claims whose outcome this process does not know, kept for a retry; each is one part of
# a run that failed on the store, so a few hundred cover a long outage of a busy daemon.
IN_DOUBT_KEPT = 1024


class DeliveryLedger:
    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._r = client
        self._keys = Keys(prefix)
        self._owned = OwnedKeys(client)  # a part's field holds 'sending:<token>' of its claim
        # (run id, part) -> the token of a claim that raised: nothing was sent for it.
        self._in_doubt: OrderedDict[tuple[str, str], str] = OrderedDict()

    def _parts(self, run_id: str) -> str:
        return self._keys.delivery(run_id)

    def _result(self, run_id: str) -> str:
        return self._keys.result(run_id)

    async def claim(
        self, run_id: str, part: str, *, result: RunResult | None = None, also: RideAlong | None = None
    ) -> bool:
        """True exactly once per ``(run_id, part)``, across replicas and retries. With
        ``result``, :meth:`save_result` in the same step (before anything is sent); with
        ``also``, those writes in the same round trip too.

        When it raises, the claim may hold on the server all the same; its token is kept,
        so this process's next claim of the part (the run's resume) takes it over."""
        doubt = (run_id, part)
        token = self._in_doubt.pop(doubt, None) or uuid.uuid4().hex
        pipe = self._r.pipeline(transaction=True)
        if result is not None:
            pipe.set(self._result(run_id), _result_json(result), ex=_TTL_S)
        key = self._parts(run_id)
        self._owned.queue_acquire_field(pipe, key, part, SENDING + token)
        claimed = len(pipe) - 1
        pipe.expire(key, _TTL_S)
        try:
            replies = await execute_with(pipe, also)
        except BaseException:
            self._in_doubt[doubt] = token
            if len(self._in_doubt) > IN_DOUBT_KEPT:
                self._in_doubt.popitem(last=False)
            raise
        return bool(replies[claimed])

    async def release(self, run_id: str, part: str) -> None:
        """Forget a claim whose send surely did not happen, so it may be claimed again."""
        await self._r.hdel(self._parts(run_id), part)

    async def mark(self, run_id: str, part: str, state: str) -> None:
        await self._r.hset(self._parts(run_id), part, state)

    def mark_along(self, run_id: str, part: str, state: str) -> RideAlong:
        """:meth:`mark`, to ride along another step's round trip."""
        def queue(pipe: Pipeline) -> Callable[[list[Any]], None]:
            pipe.hset(self._parts(run_id), part, state)
            return lambda replies: None
        return queue

    async def states(self, run_id: str) -> dict[str, str]:
        return {str(k): str(v) for k, v in (await self._r.hgetall(self._parts(run_id))).items()}

    async def save_result(self, run_id: str, result: RunResult, *, also: RideAlong | None = None) -> None:
        pipe = self._r.pipeline(transaction=True)
        pipe.set(self._result(run_id), _result_json(result), ex=_TTL_S)
        await execute_with(pipe, also)

    async def load_result(self, run_id: str) -> RunResult | None:
        raw = await self._r.get(self._result(run_id))
        return RunResult.model_validate_json(raw) if raw else None


def _result_json(result: RunResult) -> str:
    # Fields at their defaults are left out (the reader restores them): a result is kept
    # for a week per run, and half of a short one's JSON would be nulls and falses.
    return result.model_dump_json(exclude_defaults=True)


# ---- previews ------------------------------------------------------------

# Bounded attribute run: a tag longer than that is not a thinking tag, and no scan restarts
# can make this quadratic on hostile streamed text.
_OPEN_THINKING = re.compile(r"<(redacted_thinking|thinking|think|thought|antthinking)\b[^<>]{0,200}>", re.IGNORECASE)
_NAMES = ("redacted_thinking", "thinking", "think", "thought", "antthinking")
_WRAPPERS = " \t\r\n_.,:;!?\"'`*~#>-()[]{}"
_SILENT_TOKENS = ("NO_REPLY", "HEARTBEAT_OK")


def _cut_unclosed_thinking(text: str) -> str:
    lowered = text.lower()
    last_close = {name: lowered.rfind(f"</{name}") for name in _NAMES}
    for match in _OPEN_THINKING.finditer(text):
        if last_close[match.group(1).lower()] < match.end():
            return text[: match.start()]
    return text


def _cut_partial_tag(text: str) -> str:
    tail_start = max(0, len(text) - 40)
    lt = text.rfind("<", tail_start)
    if lt != -1 and ">" not in text[lt:]:
        return text[:lt]
    return text


def preview_text(raw: str) -> str | None:
    """The text to show for ``raw`` so far, or None when nothing may be shown yet."""
    text = sanitize(_cut_partial_tag(_cut_unclosed_thinking(raw)))
    core = text.strip(_WRAPPERS)
    if not core:
        return None
    upper = core.upper()
    for token in _SILENT_TOKENS:
        if upper.startswith(token) or token.startswith(upper):
            return None
    if is_silent_chat(text):
        return None
    return text


# ---- the reply -----------------------------------------------------------

PREVIEW_MIN_INTERVAL_S = 0.2


def final_text(raw: str, kind: RunKind) -> str | None:
    """Sanitized text to deliver, or None when the reply is silent for this kind of run."""
    text = sanitize(raw)
    if kind == "heartbeat":
        kept = heartbeat_reply(text)
        if kept is None:
            return None
        text = kept
    if kind == "cron" and is_silent_cron(text):
        return None
    if is_silent_chat(text) or not text.strip():
        return None
    return text


class Reply:
    """One run's reply: previews while the model writes, then the final parts once each."""

    def __init__(
        self,
        channel: ChannelAdapter,
        target: Target,
        run_id: str,
        ledger: DeliveryLedger,
        *,
        kind: RunKind,
        previews: bool,
        redelivery: Redelivery | None = None,
        resumed: bool = True,
    ) -> None:
        self._channel = channel
        self._target = target
        self._run_id = run_id
        self._ledger = ledger
        self._kind = kind
        self._previews = previews
        self._redelivery = redelivery
        # resumed: an earlier attempt may have left a preview for the stream to take over.
        self._stream: ReplyStream = channel.open_stream(target, run_id, resumed=resumed)
        self._raw: list[str] = []  # the streamed text; joined only when a preview is due
        self._last_preview = ""
        self._last_preview_at = 0.0
        self._started = False
        # The last part's "sent" mark, left to ride along the run's finish in the inbox
        # (``RunOutcome.also``): only the message id is lost if that never comes, and the
        # part's claim alone keeps it from being sent twice.
        self.deferred_mark: RideAlong | None = None

    async def start(self) -> None:
        self._started = True
        await self._safe("start", self._stream.start())

    async def on_chunk(self, delta: str) -> None:
        self._raw.append(delta)
        if not self._previews:
            return
        # Channels throttle their edits further; this bounds the work of re-reading the
        # growing text, which would otherwise be quadratic in the answer's length.
        now = time.monotonic()
        if now - self._last_preview_at < PREVIEW_MIN_INTERVAL_S:
            return
        self._last_preview_at = now
        text = preview_text("".join(self._raw))
        if text is None or text == self._last_preview:
            return
        self._last_preview = text
        await self._safe("preview", self._stream.preview(text))

    def reset_text(self) -> None:
        """A new assistant turn starts (after tool calls): the preview restarts with it."""
        self._raw = []

    async def on_tool(self, name: str, *, done: bool = False, ok: bool = True, ms: float = 0.0) -> None:
        """Tell a stream that shows tool activity (see :class:`ToolActivity`) about a tool call."""
        stream = self._stream
        if self._previews and isinstance(stream, ToolActivity):
            await self._safe("tool", stream.tool_finished(name, ok, ms) if done else stream.tool_started(name))

    async def finish(
        self, raw_final: str, result: RunResult | None = None, *, also: RideAlong | None = None
    ) -> DeliveryStatus:
        """Deliver the final answer (or nothing, when silent); close the stream either way.
        ``result`` is saved before anything is sent, so a retry after a crash delivers it
        without asking the model again; ``also`` (with a ``result`` only) rides along in
        that step, and does not run when nothing is saved."""
        try:
            text = final_text(raw_final, self._kind)
            if text is None:
                if result is not None:
                    await self._ledger.save_result(self._run_id, result, also=also)
                await self._safe("discard", self._stream.discard())
                metrics.DELIVERIES.labels(self._target.channel, "silent").inc()
                return "silent"
            return await self._deliver_parts(text, result, also if result is not None else None)
        finally:
            await self._safe("close", self._stream.close())

    async def abandon(self) -> None:
        """The run was stopped or failed: remove the preview, stop typing."""
        await self._safe("discard", self._stream.discard())
        await self._safe("close", self._stream.close())

    async def _deliver_parts(self, text: str, result: RunResult | None, also: RideAlong | None) -> DeliveryStatus:
        parts = self._channel.format_parts(text)
        if result is not None and not parts:
            await self._ledger.save_result(self._run_id, result, also=also)
        status: DeliveryStatus = "delivered"
        for index, part in enumerate(parts):
            key = str(index)
            first = index == 0
            if not await self._ledger.claim(self._run_id, key, result=result if first else None,
                                            also=also if first else None):
                log.info("delivery.skip_already_sent", run_id=self._run_id, part=index)
                continue
            started = time.monotonic()
            try:
                message_id = await self._stream.deliver(index, part)
            except asyncio.CancelledError:
                await asyncio.shield(self._ledger.mark(self._run_id, key, "unknown"))
                raise
            except DeliveryUnknown as exc:  # it may be out: never sent again, nor redelivered
                log.error("delivery.unknown", run_id=self._run_id, part=index, error=str(exc))
                await self._ledger.mark(self._run_id, key, "unknown")
                metrics.DELIVERIES.labels(self._target.channel, "unknown").inc()
                status = "unknown" if status == "delivered" else status
                continue
            except Exception as exc:
                log.error("delivery.failed", run_id=self._run_id, part=index, error=str(exc))
                await self._ledger.mark(self._run_id, key, f"failed:{type(exc).__name__}")
                metrics.DELIVERIES.labels(self._target.channel, "failed").inc()
                status = "failed"
                if self._redelivery is not None:  # kept in the ledger, retried later with backoff
                    await self._redelivery.defer(self._run_id, index, part, self._target)
                continue
            sent = f"sent:{message_id or ''}"
            if index == len(parts) - 1:
                self.deferred_mark = self._ledger.mark_along(self._run_id, key, sent)
            else:
                await self._ledger.mark(self._run_id, key, sent)
            metrics.DELIVERIES.labels(self._target.channel, "sent").inc()
            log.debug("delivery.sent", run_id=self._run_id, part=index, ms=round((time.monotonic() - started) * 1000))
        return status

    async def _safe(self, what: str, coro: object) -> None:
        try:
            await coro  # type: ignore[misc]
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("reply.stream_error", op=what, run_id=self._run_id, error=str(exc))


async def notify(
    channel: ChannelAdapter, target: Target, ledger: DeliveryLedger, run_id: str, key: str, text: str
) -> bool:
    """Send a notice once per ``(run_id, key)``; False when it was already sent or failed."""
    if not await ledger.claim(run_id, key):
        return False
    try:
        message_id = await channel.send_text(target, text)
    except Exception as exc:
        log.error("notice.failed", run_id=run_id, notice=key, error=str(exc))
        await ledger.mark(run_id, key, f"failed:{type(exc).__name__}")
        return False
    await ledger.mark(run_id, key, f"sent:{message_id or ''}")
    return True
