"""Outbound Bot API calls with Telegram's flood control and transient errors handled.

* ``429 retry_after`` is honoured per chat: the chat is paused for that long (other
  sends to it wait too), then the call is retried;
* network errors and timeouts are retried a bounded number of times with backoff,
  then logged with the run id and raised, so the caller can record the failure; but a
  call that makes a message (``sendMessage``, a file) whose request may have arrived
  (no answer in time, or the connection closed before one) is never sent again: it
  raises :class:`~channels.base.DeliveryUnknown`, since the Bot API has no idempotency
  key and a second send could show the message twice;
* a group upgraded to a supergroup (``ChatMigrated``) is retried in the new chat;
* HTML that Telegram cannot parse is resent once as plain text, and "message is not
  modified" on an edit counts as success;
* an answer the library cannot read (``{"ok": true, "result": null}`` from a proxy or a
  broken server) becomes :class:`MalformedAnswer`: the call did reach the Bot API and
  may have taken effect, so it is never retried.

``once=True`` makes one attempt only (a 429 still pauses the chat): previews use it, as
a preview that fails is given up rather than waited for.
"""

from __future__ import annotations

import asyncio
import re
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeVar

import structlog
from telegram import Bot, InlineKeyboardMarkup, ReplyParameters
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest, ChatMigrated, NetworkError, RetryAfter, TelegramError

from agent.tasks import raise_if_cancelled
from agent.types import TelegramChat
from channels.base import DeliveryUnknown, Target, may_have_arrived
from channels.telegram.format import html_to_plain
from channels.telegram.redact import scrub

log = structlog.get_logger(__name__)

T = TypeVar("T")
ChatId = int | str
# Calls that make a message: sent twice, they show it twice.
CREATING = frozenset({"sendMessage", "sendPhoto", "sendDocument"})


@dataclass(frozen=True)
class ChatRef:
    """Where outbound messages go: a chat, its forum topic, and the message to reply to."""

    chat_id: ChatId
    thread_id: int | None = None
    reply_to: int | None = None


def chat_ref(target: Target) -> ChatRef:
    """Where a reply goes: topic thread if any; a reply to the trigger only in groups."""
    chat_id: int | str = int(target.chat_id) if re.fullmatch(r"-?\d+", target.chat_id) else target.chat_id
    thread = int(target.thread_id) if target.thread_id and target.thread_id.isdigit() else None
    if isinstance(target.chat, TelegramChat):
        chat_type: str = target.chat.chat_type
    else:
        chat_type = "private" if isinstance(chat_id, int) and chat_id > 0 else "group"
    reply_to = None
    if chat_type != "private" and target.reply_to and target.reply_to.isdigit():
        reply_to = int(target.reply_to)
    return ChatRef(chat_id=chat_id, thread_id=thread, reply_to=reply_to)


class MalformedAnswer(TelegramError):
    """The Bot API answered ``ok`` but with a result the library could not read."""

    def __init__(self, what: str, error: BaseException) -> None:
        super().__init__(f"malformed answer to {what}: {type(error).__name__}")


def is_parse_error(exc: BaseException) -> bool:
    return isinstance(exc, BadRequest) and "can't parse entities" in str(exc).lower()


def is_not_modified(exc: BaseException) -> bool:
    return isinstance(exc, BadRequest) and "message is not modified" in str(exc).lower()


def retry_after_seconds(exc: RetryAfter) -> float:
    """``RetryAfter.retry_after`` as seconds (int or timedelta, depending on the library's mode)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value: Any = exc.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


class TelegramSender:
    """Bot API calls for one bot with per-chat flood control and bounded retries."""

    def __init__(
        self,
        bot: Bot,
        *,
        max_attempts: int = 4,
        backoff_s: float = 0.5,
        max_retry_after_s: float = 600.0,
        max_flood_waits: int = 5,
    ) -> None:
        self.bot = bot
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.max_flood_waits = max_flood_waits
        self._paused_until: dict[str, float] = {}

    async def _wait_for_chat(self, chat_id: ChatId) -> None:
        delay = self._paused_until.get(str(chat_id), 0.0) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def _pause_chat(self, chat_id: ChatId, seconds: float) -> None:
        key = str(chat_id)
        self._paused_until[key] = max(self._paused_until.get(key, 0.0), time.monotonic() + seconds)

    async def call(
        self, chat_id: ChatId, what: str, fn: Callable[[ChatId], Awaitable[T]], *, run_id: str = "",
        once: bool = False,
    ) -> T:
        """Run ``fn(chat_id)`` with flood control and retries; raises the last error."""
        attempts = floods = 0
        while True:
            await self._wait_for_chat(chat_id)
            try:
                result = await fn(chat_id)
                raise_if_cancelled()
                return result
            except (AttributeError, TypeError, KeyError, ValueError) as exc:
                log.warning("telegram.malformed_answer", what=what, chat_id=str(chat_id), run_id=run_id,
                            error=type(exc).__name__)
                raise MalformedAnswer(what, exc) from None
            except RetryAfter as exc:
                wait = retry_after_seconds(exc)
                floods += 1
                if once:  # not waited for here, but the chat's next calls wait
                    log.info("telegram.rate_limited", what=what, chat_id=str(chat_id), run_id=run_id, retry_after=wait)
                    self._pause_chat(chat_id, min(wait, self.max_retry_after_s))
                    raise
                if floods > self.max_flood_waits or wait > self.max_retry_after_s:
                    log.error("telegram.send_failed", what=what, chat_id=str(chat_id), run_id=run_id, error=scrub(str(exc)))
                    raise
                log.info("telegram.rate_limited", what=what, chat_id=str(chat_id), run_id=run_id, retry_after=wait)
                self._pause_chat(chat_id, wait)
            except ChatMigrated as exc:
                log.info("telegram.chat_migrated", old=str(chat_id), new=str(exc.new_chat_id), run_id=run_id)
                chat_id = exc.new_chat_id
            except BadRequest:
                raise
            except NetworkError as exc:  # includes TimedOut
                raise_if_cancelled()
                attempts += 1
                if once:
                    raise
                if what in CREATING and may_have_arrived(exc.__cause__ or exc):
                    log.error("telegram.send_unknown", what=what, chat_id=str(chat_id), run_id=run_id,
                              error=scrub(str(exc)))
                    raise DeliveryUnknown(f"{what} may have been sent: {scrub(str(exc))}") from None
                if attempts >= self.max_attempts:
                    log.error(
                        "telegram.send_failed", what=what, chat_id=str(chat_id), run_id=run_id,
                        attempts=attempts, error=scrub(str(exc)),
                    )
                    raise
                log.warning("telegram.send_retry", what=what, chat_id=str(chat_id), run_id=run_id, error=scrub(str(exc)))
                await asyncio.sleep(self.backoff_s * 2 ** (attempts - 1))

    async def send(
        self,
        chat: ChatRef,
        html: str,
        *,
        run_id: str = "",
        reply: bool = True,
        reply_markup: InlineKeyboardMarkup | None = None,
        once: bool = False,
    ) -> int:
        """Send one HTML message (plain text if Telegram cannot parse it); its message id."""
        reply_to = None
        if reply and chat.reply_to is not None:
            reply_to = ReplyParameters(chat.reply_to, allow_sending_without_reply=True)

        async def send_as(text: str, mode: str | None) -> int:
            return await self._call_for_id(
                chat, "sendMessage", run_id, once, text=text, message_thread_id=chat.thread_id, parse_mode=mode,
                reply_markup=reply_markup, reply_parameters=reply_to,
            )

        try:
            return await send_as(html, ParseMode.HTML)
        except BadRequest as exc:
            if not is_parse_error(exc):
                raise
            log.warning("telegram.parse_error_resend_plain", chat_id=str(chat.chat_id), run_id=run_id, error=scrub(str(exc)))
            return await send_as(html_to_plain(html), None)

    async def edit(
        self,
        chat: ChatRef,
        message_id: int,
        html: str,
        *,
        run_id: str = "",
        reply_markup: InlineKeyboardMarkup | None = None,
        once: bool = False,
    ) -> Literal["edited", "unchanged"]:
        """Replace a message's text; raises BadRequest when it cannot be edited (e.g. deleted)."""

        async def edit_as(text: str, mode: str | None) -> None:
            await self._call_for_id(
                chat, "editMessageText", run_id, once, text=text, message_id=message_id, parse_mode=mode,
                reply_markup=reply_markup,
            )

        try:
            try:
                await edit_as(html, ParseMode.HTML)
            except BadRequest as exc:
                if not is_parse_error(exc):
                    raise
                log.warning("telegram.parse_error_resend_plain", chat_id=str(chat.chat_id), run_id=run_id)
                await edit_as(html_to_plain(html), None)
        except BadRequest as exc:
            if is_not_modified(exc):
                return "unchanged"
            raise
        return "edited"

    async def _call_for_id(self, chat: ChatRef, endpoint: str, run_id: str, once: bool, **fields: Any) -> int:
        """:meth:`call` of ``endpoint`` with ``fields`` (None left out), for the id of the
        message it made or edited. ``Bot._post`` is the library's Bot API call (its request
        encoding and error mapping) without turning the answer into objects:
        ``send_message`` and ``edit_message_text`` parse a ``Message`` (~0.2 ms; twice that
        with the message it replies to) of which botd reads one integer. An answer without
        one is a ``TypeError``, which :meth:`call` reports as :class:`MalformedAnswer`: the
        message may or may not have been sent or edited."""

        async def post(chat_id: ChatId) -> int:
            result = await self.bot._post(endpoint, {"chat_id": chat_id, **fields})
            message_id = result.get("message_id") if isinstance(result, dict) else None
            if type(message_id) is not int:
                raise TypeError(f"{endpoint} answered without a message id")
            return message_id

        return await self.call(chat.chat_id, endpoint, post, run_id=run_id, once=once)

    async def delete(self, chat: ChatRef, message_id: int, *, run_id: str = "") -> bool:
        """Delete a message; False (logged) when Telegram refuses."""
        try:
            return await self.call(
                chat.chat_id, "deleteMessage",
                lambda cid: self.bot.delete_message(cid, message_id), run_id=run_id,
            )
        except TelegramError as exc:
            log.info("telegram.delete_failed", chat_id=str(chat.chat_id), run_id=run_id, error=scrub(str(exc)))
            return False

    async def typing(self, chat: ChatRef) -> None:
        """One typing action, best effort: never waits out a flood limit, never raises."""
        if self._paused_until.get(str(chat.chat_id), 0.0) > time.monotonic():
            return
        try:
            await self.bot.send_chat_action(chat.chat_id, ChatAction.TYPING, message_thread_id=chat.thread_id)
            raise_if_cancelled()
        except RetryAfter as exc:
            self._pause_chat(chat.chat_id, retry_after_seconds(exc))
        except TelegramError as exc:
            raise_if_cancelled()
            log.debug("telegram.typing_failed", chat_id=str(chat.chat_id), error=scrub(str(exc)))
