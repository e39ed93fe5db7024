"""The live reply of one run in one Telegram chat: typing, a throttled preview, the final parts.

``preview`` only records the latest text; a background task pushes it at most once per
``edit_interval_s`` (first as a new message, then by editing it). The first push waits
``first_preview_delay_s`` after the first text: an answer complete by then (most short
ones) goes out once, as the final message, instead of as a preview plus an edit, which
costs a Bot API call, two store writes and a visible flicker for nothing. Previews are a
courtesy: the first push that fails in any way (an error status, a timeout, a dropped
connection, an unreadable answer, "message can't be edited", a deleted preview, a 429)
ends previewing for the run, and the preview is left as it is until the final answer.

``deliver(0, part)`` turns a healthy preview into the final first part; when previews
were given up, or that last edit fails, the part is sent as a new message and the old
preview deleted, so the chat ends with the answer once and no partial copy. Further
parts are new messages. A lock orders every change to the preview, so a late preview
edit can never overwrite the final text. ``discard`` deletes the preview; ``close``
stops typing.

The preview's message id is kept in the store under the run id: a run retried after a
crash (SIGKILL, node loss) adopts the previous attempt's preview, goes on editing it
and finalizes or deletes it, instead of leaving a stale partial in the chat.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog
from telegram.error import TelegramError

from agent.tasks import raise_if_cancelled
from channels.preview_memory import PreviewBook, PreviewMemory
from channels.telegram.redact import scrub
from channels.telegram.send import ChatRef, MalformedAnswer, TelegramSender

log = structlog.get_logger(__name__)

TYPING_INTERVAL_S = 4.0  # the default of TelegramSettings.typing_interval_s
PREVIEW_TIMEOUT_S = 5.0  # the default of TelegramSettings.preview_timeout_s
FIRST_PREVIEW_DELAY_S = 0.5  # the default of TelegramSettings.first_preview_delay_s


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
        preview_timeout_s: float = PREVIEW_TIMEOUT_S,
        first_preview_delay_s: float = FIRST_PREVIEW_DELAY_S,
        memory: PreviewMemory | None = None,
    ) -> None:
        self.sender = sender
        self.chat = chat
        self.run_id = run_id
        self.render_preview = render_preview
        self.edit_interval_s = edit_interval_s
        self.typing_interval_s = typing_interval_s
        self.preview_timeout_s = preview_timeout_s
        # Never later than the regular rhythm: a short interval asks for early previews.
        self.first_preview_delay_s = min(first_preview_delay_s, edit_interval_s)
        self.memory = memory or PreviewBook(None, "telegram").memory(run_id, str(chat.chat_id))  # None: no record
        self.preview_message_id: int | None = None
        self.previews_failed = False  # a preview call failed: no more previews in this run
        self._latest: str | None = None
        self._pushed: str | None = None
        self._pushed_source: str | None = None
        self._next_push = 0.0  # monotonic time the next preview push is due
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

    async def _adopt(self) -> None:
        """Take over the preview a previous attempt of this run left (caller holds the lock)."""
        previous = await self.memory.recall()
        if previous is not None and previous.isdigit() and self.preview_message_id is None:
            self.preview_message_id = int(previous)
            self._pushed = self._pushed_source = None
            log.info("telegram.preview_adopted", run_id=self.run_id)

    # -- preview --------------------------------------------------------------------

    async def preview(self, text: str) -> None:
        if self._final or self._closed or self.previews_failed or not text.strip():
            return
        self._latest = text
        self._dirty.set()
        if self._flush_task is None:
            self._next_push = time.monotonic() + self.first_preview_delay_s
            self._flush_task = asyncio.create_task(self._flush_loop(), name=f"tg-preview-{self.run_id}")

    async def _flush_loop(self) -> None:
        while True:
            raise_if_cancelled()
            await self._dirty.wait()
            wait = self._next_push - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._dirty.clear()
            async with self._lock:
                if self._final or self.previews_failed or self._latest is None:
                    return
                await self._push(self._latest)
                self._next_push = time.monotonic() + self.edit_interval_s

    async def _push(self, text: str) -> None:
        """Show ``text`` in the preview message (caller holds the lock); never raises."""
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
            await self._adopt()
            if self.preview_message_id is None:
                self.preview_message_id = await self.sender.send(self.chat, rendered, run_id=self.run_id, once=True)
                await self.memory.remember(str(self.preview_message_id))
            else:
                async with asyncio.timeout(self.preview_timeout_s):
                    await self.sender.edit(self.chat, self.preview_message_id, rendered, run_id=self.run_id, once=True)
            self._pushed = rendered
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure: stop previewing, the final answer still goes out
            self.previews_failed = True
            log.info("telegram.preview_given_up", run_id=self.run_id, error=scrub(str(exc) or type(exc).__name__))

    async def _stop_previews(self) -> None:
        """No preview may change after this returns (caller holds the lock)."""
        self._final = True
        task, self._flush_task = self._flush_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
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
        if index == 0:
            await self._adopt()
            preview_id = self.preview_message_id
            if preview_id is not None and not self.previews_failed and await self._finalize_preview(preview_id, part):
                self.preview_message_id = None
                await self.memory.forget()
                return str(preview_id)
        try:
            return await self._send_part(index, part)
        finally:  # sent or failed, a partial preview must not stay behind
            await self._delete_preview()

    async def _finalize_preview(self, preview_id: int, part: str) -> bool:
        """Edit the preview into the final part; False (logged) when that failed in any way."""
        try:
            async with asyncio.timeout(self.preview_timeout_s):
                await self.sender.edit(self.chat, preview_id, part, run_id=self.run_id, once=True)
            return True
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("telegram.final_edit_failed", run_id=self.run_id, error=scrub(str(exc) or type(exc).__name__))
            return False

    async def _send_part(self, index: int, part: str) -> str:
        try:
            message_id = await self.sender.send(self.chat, part, run_id=self.run_id, reply=index == 0)
        except MalformedAnswer:
            return ""  # Telegram said ok: the part went out, only its id is unknown
        return str(message_id)

    async def _delete_preview(self) -> None:
        """Delete the preview (a stale partial once the answer is out); best effort."""
        preview_id, self.preview_message_id = self.preview_message_id, None
        if preview_id is None:
            return
        try:
            deleted = await self.sender.delete(self.chat, preview_id, run_id=self.run_id)
        except TelegramError as exc:
            log.info("telegram.preview_delete_failed", run_id=self.run_id, error=scrub(str(exc)))
            deleted = False
        if deleted:
            await self.memory.forget()

    async def discard(self) -> None:
        async with self._lock:
            await self._stop_previews()
            await self._stop_typing()
            await self._adopt()
            await self._delete_preview()

    async def close(self) -> None:
        self._closed = True
        await self._stop_typing()
        async with self._lock:
            if self._flush_task is not None:
                await self._stop_previews()
