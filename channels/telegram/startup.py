"""Bringing the Bot API up: the client, a bounded connect, and failures as one-line errors.

Start-up is the one moment a Telegram outage must stop the daemon (a bot that cannot
reach Telegram should not look alive), so its retry budget and its error wording live
here, apart from the adapter's steady-state work; after start-up, outages are the
poller's to ride out.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Iterable

import structlog
from telegram import Bot, BotCommand
from telegram.error import BadRequest, InvalidToken, NetworkError, RetryAfter, TelegramError

from channels.base import ChannelStartError, KeyValue
from channels.telegram.redact import scrub
from channels.telegram.settings import TelegramSettings
from channels.telegram.transport import BotAPIRequest

log = structlog.get_logger(__name__)

_COMMAND_NAME = re.compile(r"^[a-z0-9_]{1,32}$")
# Start-up failures worth another try: no (usable) answer. BadRequest is a NetworkError in
# python-telegram-bot but an answer all the same, and is never retried.
UNREACHABLE = (NetworkError, RetryAfter, OSError, TimeoutError)


class TelegramStartError(ChannelStartError):
    """The channel cannot start; the message is one line naming the key to fix, safe to show."""


def api_base(settings: TelegramSettings) -> str:
    """The Bot API base URL without a trailing slash (the public API unless configured)."""
    return (settings.api_base_url or "https://api.telegram.org/bot").rstrip("/")


def make_bot(settings: TelegramSettings) -> Bot:
    """A ``Bot`` with separate pools for calls and long polls, so a poll never starves a send."""
    base = api_base(settings)
    file_base = base[: -len("/bot")] + "/file/bot" if base.endswith("/bot") else base + "/file"
    return Bot(
        settings.token,
        base_url=base,
        base_file_url=file_base,
        request=BotAPIRequest(
            connection_pool_size=32, read_timeout=15, write_timeout=15, connect_timeout=10, pool_timeout=5
        ),
        get_updates_request=BotAPIRequest(connection_pool_size=2, read_timeout=10, connect_timeout=10),
    )


async def bring_up_bounded(
    settings: TelegramSettings, bring_up: Callable[[], Awaitable[None]], backoff_s: float
) -> None:
    """``bring_up`` with a few attempts within ``start_timeout_s``; the last failure is raised."""
    delay = backoff_s
    async with asyncio.timeout(settings.start_timeout_s):
        for attempt in range(1, settings.start_attempts + 1):
            try:
                await bring_up()
                return
            except UNREACHABLE as exc:
                if isinstance(exc, BadRequest) or attempt == settings.start_attempts:
                    raise
                log.warning("telegram.connect_failed", error=scrub(str(exc)), attempt=attempt, retry_in_s=delay)
                await asyncio.sleep(delay)
                delay *= 2


def start_error(exc: BaseException, settings: TelegramSettings) -> TelegramStartError | None:
    """The one-line error for a failed start-up, or None when ``exc`` is not a start-up failure.

    A rejected token is the operator's to fix (exit 2); an unreachable or unreadable Bot API
    is reported with exit 1, naming ``telegram.api_base_url`` and the network.
    """
    if isinstance(exc, InvalidToken):
        return TelegramStartError("the Bot API rejected telegram.token; check the token")
    if isinstance(exc, (AttributeError, TypeError, KeyError, ValueError)):  # e.g. getMe without a field
        return TelegramStartError(
            f"the Bot API answered getMe with an unreadable result ({type(exc).__name__}); "
            "check that telegram.api_base_url points at a Telegram Bot API",
            exit_code=1,
        )
    if isinstance(exc, BadRequest):
        return _refused(exc, settings)
    if isinstance(exc, UNREACHABLE):
        if isinstance(exc, TimeoutError):
            cause = f"no answer within {settings.start_timeout_s:g} s"
        else:
            # "aiohttp.ClientConnectorError: Cannot connect to host …": the library's name is noise here.
            cause = re.sub(r"^(aiohttp|httpx)\.\w+: ", "", scrub(str(exc))) or type(exc).__name__
        return TelegramStartError(
            f"cannot reach the Telegram Bot API at {api_base(settings)} ({cause}); check the network "
            "(proxy, firewall, DNS) or telegram.api_base_url",
            exit_code=1,
        )
    if isinstance(exc, TelegramError):
        return _refused(exc, settings)
    return None


def _refused(exc: TelegramError, settings: TelegramSettings) -> TelegramStartError:
    """The Bot API answered but refused a start-up call (a bad webhook URL, say)."""
    key = "telegram.webhook_url" if settings.mode == "webhook" else "telegram.api_base_url"
    return TelegramStartError(
        f"the Bot API at {api_base(settings)} refused start-up ({scrub(str(exc))}); check {key}",
        exit_code=2 if isinstance(exc, BadRequest) else 1,
    )


async def sync_commands(bot: Bot, kv: KeyValue, bot_id: int, wanted: Iterable[tuple[str, str]]) -> None:
    """setMyCommands only when the list differs from the last one set (hash in the store).

    Every replica starts with the same list; the hash keeps a rolling restart from
    calling setMyCommands once per replica. A failure is logged, never fatal.
    """
    commands = []
    for name, description in wanted:
        command = name.lstrip("/").lower()
        if not _COMMAND_NAME.match(command) or not description.strip():
            log.warning("telegram.command_skipped", command=name)
            continue
        commands.append((command, description.strip()[:256]))
    digest = hashlib.sha256(json.dumps(commands).encode()).hexdigest()
    key = f"telegram:commands:{bot_id}"
    try:
        if await kv.get(key) == digest:
            return
        if commands:
            await bot.set_my_commands([BotCommand(c, d) for c, d in commands])
        else:
            await bot.delete_my_commands()
        await kv.set(key, digest)
        log.info("telegram.commands_set", count=len(commands))
    except Exception as exc:
        log.warning("telegram.commands_failed", error=scrub(str(exc)))
