"""The Telegram channel: python-telegram-bot's ``Bot`` driven from botd's own event loop.

No ``Application``/``run_polling``: intake is our own long-poll loop (one leader per
token across replicas) or a webhook route on botd's HTTP server; both feed
:meth:`TelegramChannel.handle_update`, which normalizes, checks access and submits a
:class:`RunRequest` without waiting for the run. Outbound goes through
:class:`TelegramSender` (flood control, retries) and :class:`TelegramReplyStream`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import html
import json
import re
from pathlib import Path
from typing import Any

import structlog
from telegram import Bot, BotCommand, InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.error import BadRequest, InvalidToken, NetworkError, RetryAfter, TelegramError
from telegram.request import HTTPXRequest

from agent.types import Attachment, RunRequest, TelegramChat
from channels.base import (
    UNLISTED,
    ChannelContext,
    ChannelStartError,
    FileSink,
    PairingGate,
    ReplyStream,
    Target,
)
from channels.telegram.files import TelegramFiles
from channels.telegram.format import render_parts, render_preview
from channels.telegram.intake import (
    CONTROL_COMMANDS,
    DM_NOT_ALLOWED,
    NOT_ADDRESSED,
    Access,
    BotIdentity,
    Ignored,
    Inbound,
    MalformedUpdate,
    display_name,
    normalize_update,
)
from channels.telegram.polling import PollingIntake
from channels.telegram.redact import TokenRedactor, scrub
from channels.telegram.send import ChatRef, TelegramSender
from channels.telegram.settings import TelegramSettings
from channels.telegram.stream import TelegramReplyStream
from channels.telegram.webhook import BadUpdate, WebhookIntake

log = structlog.get_logger(__name__)

ALLOWED_UPDATES = ("message", "callback_query")
APPROVAL_ID = re.compile(r"^[A-Za-z0-9_-]{1,48}$")
_COMMAND_NAME = re.compile(r"^[a-z0-9_]{1,32}$")
APPROVAL_SUMMARY_LIMIT = 3000
# Start-up failures worth another try: no (usable) answer. BadRequest is a NetworkError in
# python-telegram-bot but an answer all the same, and is never retried.
_UNREACHABLE = (NetworkError, RetryAfter, OSError, TimeoutError)
ALBUM_TTL_S = 120.0  # an album's items arrive within seconds of each other


class TelegramStartError(ChannelStartError):
    """The channel cannot start; the message is one line naming the key to fix, safe to show."""


class TelegramChannel:
    """Implements ``channels.base.ChannelAdapter`` for Telegram."""

    name = "telegram"

    def __init__(
        self,
        settings: TelegramSettings,
    ) -> None:
        self.settings = settings
        self.access = Access(settings)
        self.lease_ttl_s = settings.lease_ttl_s
        self.lease_renew_s = settings.lease_renew_s
        self.stall_timeout_s = settings.stall_timeout_s
        self.poll_timeout_s = settings.poll_timeout_s
        self.poll_backoff_s = settings.poll_backoff_s
        self.typing_interval_s = settings.typing_interval_s
        self.send_attempts = settings.send_attempts
        self.send_backoff_s = settings.send_backoff_s
        self.connect_backoff_s = settings.connect_backoff_s
        self.message_limit = settings.message_limit
        self.preview_timeout_s = settings.preview_timeout_s
        self.me: BotIdentity | None = None
        self.poller: PollingIntake | None = None
        self._ctx: ChannelContext | None = None
        self._bot: Bot | None = None
        self._sender: TelegramSender | None = None
        self._files: TelegramFiles | None = None
        self._command_names: frozenset[str] = CONTROL_COMMANDS
        self._up = False
        self._stopping = False
        self._redactor = TokenRedactor(settings.token)
        self.webhook = WebhookIntake(
            settings.effective_webhook_secret, self._handle_json, ready=lambda: self._up and not self._stopping
        )

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, ctx: ChannelContext) -> None:
        """Connect (getMe), sync commands, then start polling or register the webhook.

        A rejected token raises :class:`TelegramStartError` (exit 2). A Bot API that cannot be
        reached is tried ``start_attempts`` times within ``start_timeout_s``, then start-up fails
        (exit 1): a daemon that cannot talk to Telegram should not look alive. Once started,
        an outage is the poller's to ride out.
        """
        self._ctx = ctx
        self._stopping = False
        self._command_names = CONTROL_COMMANDS | {c.lstrip("/").lower() for c, _ in ctx.commands}
        self._redactor.install()
        await self._close_bot()  # a restart replaces the clients of the previous run
        self._bot = self._make_bot()
        self._sender = TelegramSender(self._bot, max_attempts=self.send_attempts, backoff_s=self.send_backoff_s)
        self._files = TelegramFiles(self._sender)
        if self.settings.mode == "webhook":
            ctx.add_route("POST", self.settings.webhook_path, self.webhook.handle_request)
        try:
            await self._bring_up_bounded()
        except InvalidToken:
            await self._close_bot()
            raise TelegramStartError("the Bot API rejected telegram.token; check the token") from None
        except (AttributeError, TypeError, KeyError, ValueError) as exc:  # e.g. getMe without a field
            await self._close_bot()
            raise TelegramStartError(
                f"the Bot API answered getMe with an unreadable result ({type(exc).__name__}); "
                "check that telegram.api_base_url points at a Telegram Bot API",
                exit_code=1,
            ) from None
        except BadRequest as exc:
            await self._close_bot()
            raise self._refused(exc) from None
        except _UNREACHABLE as exc:
            await self._close_bot()
            if isinstance(exc, TimeoutError):
                cause = f"no answer within {self.settings.start_timeout_s:g} s"
            else:
                # "httpx.ConnectError: All connection attempts failed": the library's name is noise here.
                cause = re.sub(r"^httpx\.\w+: ", "", scrub(str(exc))) or type(exc).__name__
            raise TelegramStartError(
                f"cannot reach the Telegram Bot API at {self._api_base()} ({cause}); check the network "
                "(proxy, firewall, DNS) or telegram.api_base_url",
                exit_code=1,
            ) from None
        except TelegramError as exc:
            await self._close_bot()
            raise self._refused(exc) from None

    def _refused(self, exc: TelegramError) -> TelegramStartError:
        """The Bot API answered but refused a start-up call (a bad webhook URL, say)."""
        key = "telegram.webhook_url" if self.settings.mode == "webhook" else "telegram.api_base_url"
        return TelegramStartError(
            f"the Bot API at {self._api_base()} refused start-up ({scrub(str(exc))}); check {key}",
            exit_code=2 if isinstance(exc, BadRequest) else 1,
        )

    def _api_base(self) -> str:
        return (self.settings.api_base_url or "https://api.telegram.org/bot").rstrip("/")

    async def _bring_up_bounded(self) -> None:
        """``_bring_up`` with a few attempts within ``start_timeout_s``; the last failure is raised."""
        delay = self.connect_backoff_s
        async with asyncio.timeout(self.settings.start_timeout_s):
            for attempt in range(1, self.settings.start_attempts + 1):
                try:
                    await self._bring_up()
                    return
                except _UNREACHABLE as exc:
                    if isinstance(exc, BadRequest) or attempt == self.settings.start_attempts:
                        raise
                    log.warning("telegram.connect_failed", error=scrub(str(exc)), attempt=attempt, retry_in_s=delay)
                await asyncio.sleep(delay)
                delay *= 2

    def _make_bot(self) -> Bot:
        base = self._api_base()
        file_base = base[: -len("/bot")] + "/file/bot" if base.endswith("/bot") else base + "/file"
        return Bot(
            self.settings.token,
            base_url=base,
            base_file_url=file_base,
            request=HTTPXRequest(
                connection_pool_size=32, read_timeout=15, write_timeout=15, connect_timeout=10, pool_timeout=5
            ),
            get_updates_request=HTTPXRequest(connection_pool_size=2, read_timeout=10, connect_timeout=10),
        )

    async def _bring_up(self) -> None:
        assert self._bot is not None and self._ctx is not None
        await self._bot.initialize()
        user = self._bot.bot
        self.me = BotIdentity(id=user.id, username=user.username or "")
        await self._sync_commands()
        if self.settings.mode == "webhook":
            await self._bot.set_webhook(
                url=self.settings.webhook_url or "",
                secret_token=self.settings.effective_webhook_secret,
                allowed_updates=list(ALLOWED_UPDATES),
            )
        else:
            self.poller = PollingIntake(
                self._bot, self._ctx.kv, self.handle_update,
                bot_id=str(user.id), replica_id=self._ctx.replica_id, allowed_updates=ALLOWED_UPDATES,
                lease_ttl_s=self.lease_ttl_s, renew_every_s=self.lease_renew_s,
                stall_timeout_s=self.stall_timeout_s, poll_timeout_s=self.poll_timeout_s,
                backoff_s=self.poll_backoff_s,
            )
            await self.poller.start()
        self._up = True
        log.info("telegram.started", bot=self.me.username, mode=self.settings.mode)

    async def stop(self) -> None:
        """Stop intake (releasing the poller lease; the webhook answers 503).

        Outbound keeps working, so runs still finishing during a graceful shutdown can
        deliver their replies; :meth:`aclose` releases the HTTP clients at the very end.
        """
        self._stopping = True
        self._up = False
        if self.poller is not None:
            await self.poller.stop()
            self.poller = None

    async def aclose(self) -> None:
        """Stop intake and close the HTTP clients; nothing can be sent afterwards."""
        await self.stop()
        await self._close_bot()
        self._sender = None
        self._redactor.uninstall()

    async def _close_bot(self) -> None:
        if self._bot is not None:
            with contextlib.suppress(Exception):
                await self._bot.shutdown()
        if self._files is not None:
            with contextlib.suppress(Exception):
                await self._files.aclose()
            self._files = None

    def is_ready(self) -> bool:
        if not self._up or self._stopping:
            return False
        return self.poller.healthy if self.poller is not None else True

    async def _sync_commands(self) -> None:
        """setMyCommands only when the list differs from the last one set (hash in the store)."""
        assert self._bot is not None and self._ctx is not None and self.me is not None
        commands = []
        for name, description in self._ctx.commands:
            command = name.lstrip("/").lower()
            if not _COMMAND_NAME.match(command) or not description.strip():
                log.warning("telegram.command_skipped", command=name)
                continue
            commands.append((command, description.strip()[:256]))
        digest = hashlib.sha256(json.dumps(commands).encode()).hexdigest()
        key = f"telegram:commands:{self.me.id}"
        try:
            if await self._ctx.kv.get(key) == digest:
                return
            if commands:
                await self._bot.set_my_commands([BotCommand(c, d) for c, d in commands])
            else:
                await self._bot.delete_my_commands()
            await self._ctx.kv.set(key, digest)
            log.info("telegram.commands_set", count=len(commands))
        except Exception as exc:
            log.warning("telegram.commands_failed", error=scrub(str(exc)))

    # -- inbound --------------------------------------------------------------------------

    async def _handle_json(self, data: dict[str, Any]) -> None:
        try:
            update = Update.de_json(data, self._bot)
        except Exception as exc:
            raise BadUpdate(f"not a Telegram update: {exc}") from None
        await self.handle_update(update, strict=True)

    async def handle_update(self, update: Update, *, strict: bool = False) -> None:
        """Normalize, check access, submit. Raises only if submitting failed (so it is retried),
        or, when ``strict`` (the webhook), ``BadUpdate`` for a malformed update (else it is skipped)."""
        ctx = self._ctx
        if ctx is None or self.me is None:
            raise RuntimeError("the telegram channel is not started")
        access = await self._access_for(update)
        try:
            decision = normalize_update(update, self.me, access, self._command_names)
        except MalformedUpdate as exc:
            if strict:
                raise BadUpdate(str(exc)) from None
            log.warning("telegram.malformed_update", update_id=update.update_id, error=scrub(str(exc)))
            return
        except Exception:
            log.exception("telegram.normalize_failed", update_id=update.update_id)
            return
        decision = await self._album_addressed(update, decision, access, ctx)
        if isinstance(decision, Ignored):
            if decision.unauthorized:
                log.info("telegram.unauthorized", user_id=decision.user_id, chat_id=decision.chat_id,
                         reason=decision.reason)
            else:
                log.debug("telegram.ignored", update_id=update.update_id, reason=decision.reason)
            if decision.reason == DM_NOT_ALLOWED and decision.user_id and decision.chat_id:
                await self._challenge(update, decision.user_id, decision.chat_id)
            if decision.callback_id:
                await self._answer_callback(decision.callback_id, "Not allowed." if decision.unauthorized else None)
            return
        request = self._run_request(decision, ctx)
        result = await ctx.submit(request)
        log.debug("telegram.submitted", update_id=update.update_id, run_id=request.run_id, status=result.status)
        if result.status == "error":
            # Not accepted (store down, shutting down): fail so the update is delivered again.
            raise RuntimeError(f"update {update.update_id} not accepted: {result.detail}")
        if decision.callback_id:
            await self._answer_callback(decision.callback_id, "Approved." if decision.decision == "approve" else "Denied.")
            if update.callback_query is not None and update.callback_query.message is not None:
                await self._remove_buttons(update.callback_query.message.chat.id, update.callback_query.message.message_id)

    async def _album_addressed(
        self, update: Update, decision: Inbound | Ignored, access: Access, ctx: ChannelContext
    ) -> Inbound | Ignored:
        """Only an album's first item carries the caption (and the mention): in a group, the
        rest of an album whose first item addressed the bot is addressed too."""
        msg = update.message
        if msg is None or not msg.media_group_id or self.me is None:
            return decision
        key = f"telegram:album:{msg.chat.id}:{msg.media_group_id}"
        if isinstance(decision, Inbound):
            if decision.scope == "group":
                await ctx.kv.set(key, "1", ALBUM_TTL_S)
            return decision
        if decision.reason == NOT_ADDRESSED and await ctx.kv.get(key) is not None:
            return normalize_update(update, self.me, access, self._command_names, addressed=True)
        return decision

    def _pairing(self) -> PairingGate | None:
        return self._ctx.pairing if self._ctx is not None and self.settings.dm_policy == "pairing" else None

    async def _access_for(self, update: Update) -> Access:
        """With pairing, a sender approved by code counts as listed for this update."""
        pairing = self._pairing()
        try:
            user = update.effective_user
        except Exception:  # a malformed update: normalize_update says why
            return self.access
        if pairing is None or user is None or self.access.user_listed(user):
            return self.access
        return self.access.with_user(str(user.id)) if await pairing.is_approved(str(user.id)) else self.access

    async def _challenge(self, update: Update, user_id: str, chat_id: str) -> None:
        """A stranger's DM under ``dm_policy: pairing``: answered with a code, no LLM call."""
        pairing = self._pairing()
        if pairing is None:
            return
        user = update.effective_user
        await pairing.challenge(user_id, display_name(user) if user is not None else user_id, chat_id)

    def _run_request(self, inbound: Inbound, ctx: ChannelContext) -> RunRequest:
        key = ctx.session_key(inbound.scope, inbound.chat_id, topic=inbound.topic_id)
        dedupe = f"telegram:cb:{inbound.callback_id}" if inbound.callback_id else f"telegram:{inbound.update_id}"
        return RunRequest(
            session_key=key,
            channel="telegram",
            chat_id=inbound.chat_id,
            thread_id=inbound.topic_id,
            user_id=inbound.user_id,
            user_name=inbound.user_name,
            text=inbound.text,
            reply_to=inbound.message_id,
            dedupe_key=dedupe,
            chat=TelegramChat(chat_type=inbound.chat_type, is_forum=inbound.is_forum),
            attachments=list(inbound.attachments),
            meta={
                **({} if inbound.listed else {UNLISTED: "1"}),
                **({"media_group": inbound.media_group} if inbound.media_group else {}),
            },
        )

    async def _answer_callback(self, callback_id: str, text: str | None) -> None:
        if self._bot is None:
            return
        try:
            await self._bot.answer_callback_query(callback_id, text=text)
        except TelegramError as exc:
            log.info("telegram.callback_answer_failed", error=scrub(str(exc)))

    async def _remove_buttons(self, chat_id: int, message_id: int) -> None:
        assert self._bot is not None
        try:
            await self._bot.edit_message_reply_markup(chat_id=chat_id, message_id=message_id, reply_markup=None)
        except TelegramError as exc:
            log.debug("telegram.remove_buttons_failed", error=scrub(str(exc)))

    # -- outbound -------------------------------------------------------------------------

    def format_parts(self, markdown: str) -> list[str]:
        return render_parts(markdown, self.message_limit)

    def _require_sender(self) -> TelegramSender:
        if self._sender is None:
            raise RuntimeError("the telegram channel is not started")
        return self._sender

    def open_stream(self, target: Target, run_id: str) -> ReplyStream:
        return TelegramReplyStream(
            self._require_sender(), chat_ref(target), run_id,
            render_preview=lambda text: render_preview(text, self.message_limit),
            edit_interval_s=self.settings.stream_edit_interval_s,
            typing_interval_s=self.typing_interval_s,
            preview_timeout_s=self.preview_timeout_s,
            kv=self._ctx.kv if self._ctx is not None else None,
        )

    async def send_text(self, target: Target, text: str) -> str | None:
        """Send a notice (Markdown allowed); returns the first message id, None if empty."""
        sender = self._require_sender()
        chat = chat_ref(target)
        first: str | None = None
        for index, part in enumerate(self.format_parts(text)):
            msg = await sender.send(chat, part, reply=index == 0)
            first = first or str(msg.message_id)
        return first

    async def download(self, attachment: Attachment, sink: FileSink, max_bytes: int) -> tuple[int, str]:
        if self._files is None:
            raise RuntimeError("the telegram channel is not started")
        return await self._files.download(attachment, sink, max_bytes)

    async def send_file(self, target: Target, path: Path, caption: str | None) -> str | None:
        if self._files is None:
            raise RuntimeError("the telegram channel is not started")
        return str((await self._files.send(chat_ref(target), path, caption)).message_id)

    async def ask_approval(self, target: Target, approval_id: str, summary: str) -> None:
        """Post the summary with Approve/Deny buttons (callback data ``ap:<id>:y|n``)."""
        if not APPROVAL_ID.match(approval_id):
            raise ValueError(f"approval id must match {APPROVAL_ID.pattern}, got {approval_id!r}")
        if len(summary) > APPROVAL_SUMMARY_LIMIT:
            summary = summary[:APPROVAL_SUMMARY_LIMIT] + "…"
        keyboard = InlineKeyboardMarkup([[
            InlineKeyboardButton("✅ Approve", callback_data=f"ap:{approval_id}:y"),
            InlineKeyboardButton("❌ Deny", callback_data=f"ap:{approval_id}:n"),
        ]])
        body = f"<b>Approval needed</b>\n{html.escape(summary, quote=False)}"
        await self._require_sender().send(chat_ref(target), body, reply_markup=keyboard)


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
