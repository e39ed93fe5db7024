"""The outbound half of a run: live previews and exactly-once delivery of the final text."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Literal

import structlog

from agent.sanitize import heartbeat_reply, is_silent_chat, is_silent_cron, sanitize
from agent.types import RunKind
from bot import metrics
from bot.gateway.delivery import DeliveryLedger
from bot.gateway.preview import preview_text
from channels.base import ChannelAdapter, ReplyStream, Target

if TYPE_CHECKING:
    from bot.gateway.redelivery import Redelivery

log = structlog.get_logger(__name__)

PREVIEW_MIN_INTERVAL_S = 0.2

DeliveryStatus = Literal["delivered", "silent", "failed", "unknown"]


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
    ) -> None:
        self._channel = channel
        self._target = target
        self._run_id = run_id
        self._ledger = ledger
        self._kind = kind
        self._previews = previews
        self._redelivery = redelivery
        self._stream: ReplyStream = channel.open_stream(target, run_id)
        self._raw = ""
        self._last_preview = ""
        self._last_preview_at = 0.0
        self._started = False

    async def start(self) -> None:
        self._started = True
        await self._safe("start", self._stream.start())

    async def on_chunk(self, delta: str) -> None:
        self._raw += delta
        if not self._previews:
            return
        # Channels throttle their edits further; this bounds the work of re-reading the
        # growing text, which would otherwise be quadratic in the answer's length.
        now = time.monotonic()
        if now - self._last_preview_at < PREVIEW_MIN_INTERVAL_S:
            return
        self._last_preview_at = now
        text = preview_text(self._raw)
        if text is None or text == self._last_preview:
            return
        self._last_preview = text
        await self._safe("preview", self._stream.preview(text))

    def reset_text(self) -> None:
        """A new assistant turn starts (after tool calls): the preview restarts with it."""
        self._raw = ""

    async def finish(self, raw_final: str) -> DeliveryStatus:
        """Deliver the final answer (or nothing, when silent); close the stream either way."""
        try:
            text = final_text(raw_final, self._kind)
            if text is None:
                await self._safe("discard", self._stream.discard())
                metrics.DELIVERIES.labels(self._target.channel, "silent").inc()
                return "silent"
            return await self._deliver_parts(text)
        finally:
            await self._safe("close", self._stream.close())

    async def abandon(self) -> None:
        """The run was stopped or failed: remove the preview, stop typing."""
        await self._safe("discard", self._stream.discard())
        await self._safe("close", self._stream.close())

    async def _deliver_parts(self, text: str) -> DeliveryStatus:
        parts = self._channel.format_parts(text)
        status: DeliveryStatus = "delivered"
        for index, part in enumerate(parts):
            key = str(index)
            if not await self._ledger.claim(self._run_id, key):
                log.info("delivery.skip_already_sent", run_id=self._run_id, part=index)
                continue
            started = time.monotonic()
            try:
                message_id = await self._stream.deliver(index, part)
            except asyncio.CancelledError:
                await asyncio.shield(self._ledger.mark(self._run_id, key, "unknown"))
                raise
            except Exception as exc:
                log.error("delivery.failed", run_id=self._run_id, part=index, error=str(exc))
                await self._ledger.mark(self._run_id, key, f"failed:{type(exc).__name__}")
                metrics.DELIVERIES.labels(self._target.channel, "failed").inc()
                status = "failed"
                if self._redelivery is not None:  # kept in the ledger, retried later with backoff
                    await self._redelivery.defer(self._run_id, index, part, self._target)
                continue
            await self._ledger.mark(self._run_id, key, f"sent:{message_id or ''}")
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
