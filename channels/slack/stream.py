"""The live reply of one run in one Slack conversation.

``start`` puts :eyes: on the message being answered; ``preview`` shows the text so far
in a placeholder (``chat.postMessage``, then ``chat.update`` at most once per
interval, rendered only when it is actually sent, so a fast stream costs nothing). The
first one waits ``first_preview_delay_s`` after the first text, so an answer complete by
then (most short ones) is posted once: no placeholder, no update, nothing remembered;
``deliver(0, …)`` turns the placeholder into the first part of the answer (or posts
it when the update fails), further parts are posted in the thread; ``discard`` deletes
the placeholder; ``close`` removes :eyes:. Every method is idempotent and safe in any
order. Previews never block the caller on the network: a background task sends them.

Previews are a courtesy: the first preview call that fails in any way (an error, a
timeout, a dropped connection, an unreadable answer, ``msg_too_long``,
``message_not_found``, ``ratelimited``) ends previewing for the run; the answer is then
posted as new messages and the placeholder deleted, so the conversation ends with the
answer once and no partial copy. The placeholder's ts is kept in the store under the
run id: a run retried after a crash adopts the placeholder the dead attempt left and
finalizes or deletes it. A placeholder posted while the answer already waits to be
delivered is settled by that delivery at once and only recorded if it outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import structlog

from channels.base import Target
from channels.preview_memory import PreviewBook, PreviewMemory
from channels.slack.api import SlackApi, SlackCallError

log = structlog.get_logger(__name__)

WORKING_REACTION = "eyes"
FIRST_PREVIEW_DELAY_S = 0.5  # the default of SlackSettings.first_preview_delay_s

Clock = Callable[[], float]
PreviewFormatter = Callable[[str], str | None]


class SlackReplyStream:
    def __init__(
        self,
        api: SlackApi,
        target: Target,
        run_id: str,
        *,
        format_preview: PreviewFormatter,
        interval_s: float = 1.0,
        first_preview_delay_s: float = FIRST_PREVIEW_DELAY_S,
        clock: Clock = time.monotonic,
        memory: PreviewMemory | None = None,
    ) -> None:
        self._api = api
        self._target = target
        self._run_id = run_id
        self._format_preview = format_preview
        self._interval_s = interval_s
        self._first_delay_s = min(first_preview_delay_s, interval_s)
        self._clock = clock
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._pending: str | None = None
        self._last_raw: str | None = None
        self._shown: str | None = None
        self._last_sent = float("-inf")
        self._preview_ts: str | None = None
        self._delivered: dict[int, str] = {}
        self._previews_over = False
        self._delivering = False  # deliver() was called: it settles any placeholder itself
        self.previews_failed = False  # a preview call failed: the answer is posted anew
        self._memory = memory or PreviewBook(None, "slack").memory(run_id, target.chat_id)  # None: no record
        self._reacted = False
        self._closed = False

    @property
    def preview_ts(self) -> str | None:
        return self._preview_ts

    # -- reaction ---------------------------------------------------------------------
    async def start(self) -> None:
        if self._reacted or self._closed or not self._target.reply_to:
            return
        try:
            await self._api.call(
                "reactions.add",
                run_id=self._run_id,
                channel=self._target.chat_id,
                timestamp=self._target.reply_to,
                name=WORKING_REACTION,
            )
            self._reacted = True
        except SlackCallError as exc:
            self._reacted = exc.error == "already_reacted"
            if not self._reacted:
                log.warning("slack.reaction_failed", run_id=self._run_id, error=exc.error)

    async def close(self) -> None:
        await self._end_previews()
        self._closed = True
        if not self._reacted:
            return
        self._reacted = False
        try:
            await self._api.call(
                "reactions.remove",
                run_id=self._run_id,
                channel=self._target.chat_id,
                timestamp=self._target.reply_to,
                name=WORKING_REACTION,
            )
        except SlackCallError as exc:
            if exc.error != "no_reaction":
                log.warning("slack.reaction_remove_failed", run_id=self._run_id, error=exc.error)

    # -- preview ----------------------------------------------------------------------
    async def preview(self, text: str) -> None:
        if self._previews_over or text == self._last_raw:
            return
        self._last_raw = text
        self._pending = text
        if self._last_sent == float("-inf"):  # the first text: the first preview waits a little
            self._last_sent = self._clock() + self._first_delay_s - self._interval_s
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_loop(), name=f"slack-preview-{self._run_id}")

    async def _flush_loop(self) -> None:
        while self._pending is not None and not self._previews_over:
            wait = self._last_sent + self._interval_s - self._clock()
            if wait > 0:
                self._wake.clear()
                if self._previews_over:
                    return
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
                continue
            async with self._lock:
                if self._previews_over or self._pending is None:
                    return
                raw, self._pending = self._pending, None
                rendered = self._format_preview(raw)
                if not rendered or rendered == self._shown:
                    continue
                self._last_sent = self._clock()
                await self._show(rendered)

    async def _show(self, rendered: str) -> None:
        """Put ``rendered`` in the placeholder (caller holds the lock); never raises."""
        try:
            await self._adopt()
            if self._preview_ts is None:
                data = await self._post(rendered, once=True)
                self._preview_ts = str(data["ts"])
                if not self._delivering:  # else the delivery waiting for this post settles it (deliver)
                    await self._memory.remember(self._preview_ts)
            else:
                await self._update(self._preview_ts, rendered, once=True)
            self._shown = rendered
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure: no more previews, the answer still goes out
            self.previews_failed = self._previews_over = True
            error = exc.error if isinstance(exc, SlackCallError) else type(exc).__name__
            log.info("slack.preview_given_up", run_id=self._run_id, error=error)

    async def _adopt(self) -> None:
        """Take over the placeholder a previous attempt of this run left (caller holds the lock)."""
        previous = await self._memory.recall()
        if previous is not None and self._preview_ts is None:
            self._preview_ts = previous
            log.info("slack.preview_adopted", run_id=self._run_id)

    async def _end_previews(self) -> None:
        """No preview after this; wait for one being sent (never cancel a post mid-flight)."""
        self._previews_over = True
        self._wake.set()
        flusher = self._flusher
        if flusher is not None and not flusher.done() and flusher is not asyncio.current_task():
            with contextlib.suppress(Exception):
                await flusher

    # -- final answer -----------------------------------------------------------------
    async def deliver(self, index: int, part: str) -> str | None:
        # A placeholder posted from now on is turned into the answer or deleted by this call,
        # so it is not recorded (a store write and its delete saved on every quick answer).
        # Only a later stream of the run reads the record, and the gateway's ledger lets one
        # deliver this part again only after this call failed: a placeholder that outlives
        # the call is recorded then (_delete_placeholder). A crash inside the call leaves
        # the part claimed, never delivered again, so a record would not be read either.
        self._delivering = True
        await self._end_previews()
        async with self._lock:
            if index in self._delivered:
                return self._delivered[index]
            if index == 0:
                await self._adopt()
            preview_ts = self._preview_ts
            if index == 0 and preview_ts is not None and not self.previews_failed and (
                await self._finalize_preview(preview_ts, part)
            ):
                self._preview_ts = None  # from now on it is the answer, not a placeholder
                await self._memory.forget()
                ts = preview_ts
            else:
                try:
                    ts = await self._post_part(part)
                finally:  # posted or failed, a partial placeholder must not stay behind
                    await self._delete_placeholder()
            self._delivered[index] = ts
            return ts

    async def _finalize_preview(self, preview_ts: str, part: str) -> bool:
        """Update the placeholder into the answer; False (logged) when that failed in any way."""
        if part == self._shown:
            return True
        try:
            await self._update(preview_ts, part)
            return True
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = exc.error if isinstance(exc, SlackCallError) else type(exc).__name__
            log.info("slack.finalize_update_failed", run_id=self._run_id, error=error)
            return False

    async def _post_part(self, part: str) -> str:
        data = await self._post(part)
        ts = data.get("ts")
        if not ts:  # Slack said ok: the part is out, only its ts is unknown
            log.warning("slack.post_without_ts", run_id=self._run_id)
            return ""
        return str(ts)

    async def _delete_placeholder(self) -> None:
        preview_ts, self._preview_ts = self._preview_ts, None
        if preview_ts is None:
            return
        if await self._delete(preview_ts):
            await self._memory.forget()
        else:  # left in the chat: recorded, so a redelivery or a retry can still remove it
            await self._memory.remember(preview_ts)

    async def discard(self) -> None:
        await self._end_previews()
        async with self._lock:
            await self._adopt()
            await self._delete_placeholder()

    # -- calls ------------------------------------------------------------------------
    async def _post(self, text: str, *, once: bool = False) -> dict[str, Any]:
        args: dict[str, Any] = {"channel": self._target.chat_id, "text": text}
        if self._target.thread_id:
            args["thread_ts"] = self._target.thread_id
        return await self._api.call("chat.postMessage", run_id=self._run_id, once=once, **args)

    async def _update(self, ts: str, text: str, *, once: bool = False) -> None:
        await self._api.call(
            "chat.update", run_id=self._run_id, once=once, channel=self._target.chat_id, ts=ts, text=text
        )

    async def _delete(self, ts: str) -> bool:
        """Delete a message; True when it is gone (also when it already was)."""
        try:
            await self._api.call("chat.delete", run_id=self._run_id, channel=self._target.chat_id, ts=ts)
        except SlackCallError as exc:
            if exc.error != "message_not_found":
                log.warning("slack.delete_failed", run_id=self._run_id, error=exc.error)
                return False
        return True
