"""Approval buttons: the message with Approve/Deny, and tidying up after a press.

A press arrives as a callback query (see :func:`channels.telegram.intake.normalize_callback`);
Telegram shows a spinner until it is answered, and the buttons would stay pressable, so
both follow-ups live next to the message that creates them.
"""

from __future__ import annotations

import html
import re

import structlog
from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup
from telegram.error import TelegramError

from channels.telegram.redact import scrub

log = structlog.get_logger(__name__)

APPROVAL_ID = re.compile(r"^[A-Za-z0-9_-]{1,48}$")
APPROVAL_SUMMARY_LIMIT = 3000


def approval_message(approval_id: str, summary: str) -> tuple[str, InlineKeyboardMarkup]:
    """The HTML body and Approve/Deny keyboard (callback data ``ap:<id>:y|n``).

    Callback data is limited to 64 bytes, hence the strict id; the summary is cut well
    under Telegram's 4096-unit message limit.
    """
    if not APPROVAL_ID.match(approval_id):
        raise ValueError(f"approval id must match {APPROVAL_ID.pattern}, got {approval_id!r}")
    if len(summary) > APPROVAL_SUMMARY_LIMIT:
        summary = summary[:APPROVAL_SUMMARY_LIMIT] + "…"
    keyboard = InlineKeyboardMarkup([[
        InlineKeyboardButton("✅ Approve", callback_data=f"ap:{approval_id}:y"),
        InlineKeyboardButton("❌ Deny", callback_data=f"ap:{approval_id}:n"),
    ]])
    return f"<b>Approval needed</b>\n{html.escape(summary, quote=False)}", keyboard


async def answer_callback(bot: Bot | None, callback_id: str, text: str | None) -> None:
    """Stop the client's spinner; a failure only costs the user a toast, so it is logged."""
    if bot is None:
        return
    try:
        await bot.answer_callback_query(callback_id, text=text)
    except TelegramError as exc:
        log.info("telegram.callback_answer_failed", error=scrub(str(exc)))


async def remove_buttons(bot: Bot, chat_id: int, message_id: int) -> None:
    """Take the buttons off a decided approval so it cannot be pressed twice."""
    try:
        await bot.edit_message_reply_markup(chat_id=chat_id, message_id=message_id, reply_markup=None)
    except TelegramError as exc:
        log.debug("telegram.remove_buttons_failed", error=scrub(str(exc)))
