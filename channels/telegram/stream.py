"""The live reply of one run in one Telegram chat: typing, a throttled preview, the final parts.

``preview`` only records the latest text; a background task pushes it at most once per
``edit_interval_s`` (first as a new message, then by editing it). ``deliver(0, part)``
turns the preview into the final first part (falling back to a new message when the
edit fails, e.g. because someone deleted the preview); further parts are new messages.
A lock orders every change to the preview, so a late preview edit can never overwrite
the final text. ``discard`` deletes the preview; ``close`` stops typing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog
from telegram.error import BadRequest, TelegramError

from agent.tasks import raise_if_cancelled
from channels.telegram.redact import scrub
from channels.telegram.send import ChatRef, TelegramSender

log = structlog.get_logger(__name__)

TYPING_INTERVAL_S = 4.0  # the default of TelegramSettings.typing_interval_s


class TelegramReplyStream:
    """Implements ``channels.base.ReplyStream`` for Telegram."""

    def __init__(
        self,
        sender: TelegramSender,
        chat: ChatRef,
        run_id: str,
        *,
        render_preview: Callable[[str], str],
        edit_interval_s: float = 1.0,
        typing_interval_s: float = TYPING_INTERVAL_S,
    ) -> None:
        self.sender = sender
        self.chat = chat
        self.run_id = run_id
        self.render_preview = render_preview
        self.edit_interval_s = edit_interval_s
        self.typing_interval_s = typing_interval_s
        self.preview_message_id: int | None = None
        self._latest: str | None = None
        self._pushed: str | None = None
        self._pushed_source: str | None = None
        self._last_push = 0.0
        self._dirty = asyncio.Event()
        self._lock = asyncio.Lock()
        self._final = False
        self._closed = False
        self._delivered: dict[int, str | None] = {}
        self._typing_task: asyncio.Task[None] | None = None
        self._flush_task: asyncio.Task[None] | None = None

    # -- typing -------------------------------------------------------------------

    async def start(self) -> None:
        if self._typing_task is None and not self._closed and not self._final:
            self._typing_task = asyncio.create_task(self._typing_loop(), name=f"tg-typing-{self.run_id}")

    async def _typing_loop(self) -> None:
        while True:
            await self.sender.typing(self.chat)
            raise_if_cancelled()
            await asyncio.sleep(self.typing_interval_s)

    async def _stop_typing(self) -> None:
        task, self._typing_task = self._typing_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- preview --------------------------------------------------------------------

    async def preview(self, text: str) -> None:
        if self._final or self._closed or not text.strip():
            return
        self._latest = text
        self._dirty.set()
        if self._flush_task is None:
            self._flush_task = asyncio.create_task(self._flush_loop(), name=f"tg-preview-{self.run_id}")

    async def _flush_loop(self) -> None:
        while True:
            raise_if_cancelled()
            await self._dirty.wait()
            wait = self._last_push + self.edit_interval_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._dirty.clear()
            async with self._lock:
                if self._final or self._latest is None:
                    return
                await self._push(self._latest)
                self._last_push = time.monotonic()

    async def _push(self, text: str) -> None:
        """Show ``text`` in the preview message (caller holds the lock)."""
        if text == self._pushed_source:
            return
        self._pushed_source = text
        try:
            rendered = self.render_preview(text)
        except Exception:  # the preview must never break a run
            log.exception("telegram.preview_render_failed", run_id=self.run_id)
            return
        if not rendered.strip() or rendered == self._pushed:
            return
        try:
            if self.preview_message_id is None:
                msg = await self.sender.send(self.chat, rendered, run_id=self.run_id)
                self.preview_message_id = msg.message_id
            else:
                try:
                    await self.sender.edit(self.chat, self.preview_message_id, rendered, run_id=self.run_id)
                except BadRequest as exc:
                    log.info("telegram.preview_edit_failed", run_id=self.run_id, error=scrub(str(exc)))
                    msg = await self.sender.send(self.chat, rendered, run_id=self.run_id)
                    self.preview_message_id = msg.message_id
            self._pushed = rendered
        except TelegramError as exc:
            log.info("telegram.preview_failed", run_id=self.run_id, error=scrub(str(exc)))

    async def _stop_previews(self) -> None:
        """No preview may change after this returns (caller holds the lock)."""
        self._final = True
        task, self._flush_task = self._flush_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- final ------------------------------------------------------------------------

    async def deliver(self, index: int, part: str) -> str | None:
        if index in self._delivered:
            return self._delivered[index]
        async with self._lock:
            await self._stop_previews()
            await self._stop_typing()
            if index in self._delivered:
                return self._delivered[index]
            message_id = await self._deliver_locked(index, part)
            self._delivered[index] = message_id
            return message_id

    async def _deliver_locked(self, index: int, part: str) -> str:
        if index == 0 and self.preview_message_id is not None:
            preview_id, self.preview_message_id = self.preview_message_id, None
            try:
                await self.sender.edit(self.chat, preview_id, part, run_id=self.run_id)
                return str(preview_id)
            except BadRequest as exc:
                log.info("telegram.final_edit_failed", run_id=self.run_id, error=scrub(str(exc)))
        msg = await self.sender.send(self.chat, part, run_id=self.run_id, reply=index == 0)
        return str(msg.message_id)

    async def discard(self) -> None:
        async with self._lock:
            await self._stop_previews()
            await self._stop_typing()
            preview_id, self.preview_message_id = self.preview_message_id, None
            if preview_id is not None:
                await self.sender.delete(self.chat, preview_id, run_id=self.run_id)

    async def close(self) -> None:
        self._closed = True
        await self._stop_typing()
        async with self._lock:
            if self._flush_task is not None:
                await self._stop_previews()
