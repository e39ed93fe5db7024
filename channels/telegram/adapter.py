"""The Telegram channel: python-telegram-bot's ``Bot`` driven from botd's own event loop.

No ``Application``/``run_polling``: intake is our own long-poll loop (one leader per
token across replicas) or a webhook route on botd's HTTP server; both feed
:meth:`TelegramChannel.handle_update`, which normalizes, checks access and submits a
:class:`RunRequest` without waiting for the run. Outbound goes through
:class:`TelegramSender` (flood control, retries) and :class:`TelegramReplyStream`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import structlog
from telegram import Bot, Update

from agent.types import Attachment, RunRequest, TelegramChat
from channels.base import (
    UNLISTED,
    ChannelContext,
    FileSink,
    PairingGate,
    ReplyStream,
    Target,
)
from channels.preview_memory import PreviewBook
from channels.telegram.approval import answer_callback, approval_message, remove_buttons
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
from channels.telegram.send import TelegramSender, chat_ref
from channels.telegram.settings import TelegramSettings
from channels.telegram.startup import (
    TelegramStartError,
    bring_up_bounded,
    make_bot,
    start_error,
    sync_commands,
)
from channels.telegram.stream import TelegramReplyStream
from channels.telegram.webhook import BadUpdate, WebhookIntake

log = structlog.get_logger(__name__)

ALLOWED_UPDATES = ("message", "callback_query")
ALBUM_TTL_S = 120.0  # an album's items arrive within seconds of each other

__all__ = ["TelegramChannel", "TelegramStartError"]


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
        self._previews = PreviewBook(None, "telegram")  # until started: remembers nothing
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
        self._previews = PreviewBook(ctx.kv, "telegram")
        self._stopping = False
        self._command_names = CONTROL_COMMANDS | {c.lstrip("/").lower() for c, _ in ctx.commands}
        self._redactor.install()
        await self._close_bot()  # a restart replaces the clients of the previous run
        self._bot = make_bot(self.settings)
        self._sender = TelegramSender(self._bot, max_attempts=self.send_attempts, backoff_s=self.send_backoff_s)
        self._files = TelegramFiles(self._sender)
        if self.settings.mode == "webhook":
            ctx.add_route("POST", self.settings.webhook_path, self.webhook.handle_request)
        try:
            await bring_up_bounded(self.settings, self._bring_up, self.connect_backoff_s)
        except Exception as exc:
            error = start_error(exc, self.settings)
            if error is None:
                raise
            await self._close_bot()
            raise error from None

    async def _bring_up(self) -> None:
        assert self._bot is not None and self._ctx is not None
        await self._bot.initialize()
        user = self._bot.bot
        self.me = BotIdentity(id=user.id, username=user.username or "")
        await sync_commands(self._bot, self._ctx.kv, self.me.id, self._ctx.commands)
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
                await answer_callback(self._bot, decision.callback_id, "Not allowed." if decision.unauthorized else None)
            return
        request = self._run_request(decision, ctx)
        result = await ctx.submit(request)
        log.debug("telegram.submitted", update_id=update.update_id, run_id=request.run_id, status=result.status)
        if result.status == "error":
            # Not accepted (store down, shutting down): fail so the update is delivered again.
            raise RuntimeError(f"update {update.update_id} not accepted: {result.detail}")
        if decision.callback_id:
            await answer_callback(self._bot, decision.callback_id, "Approved." if decision.decision == "approve" else "Denied.")
            query = update.callback_query
            if query is not None and query.message is not None:
                assert self._bot is not None
                await remove_buttons(self._bot, query.message.chat.id, query.message.message_id)

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

    # -- outbound -------------------------------------------------------------------------

    def format_parts(self, markdown: str) -> list[str]:
        return render_parts(markdown, self.message_limit)

    def _require_sender(self) -> TelegramSender:
        if self._sender is None:
            raise RuntimeError("the telegram channel is not started")
        return self._sender

    def open_stream(self, target: Target, run_id: str, *, resumed: bool = True) -> ReplyStream:
        chat = chat_ref(target)
        return TelegramReplyStream(
            self._require_sender(), chat, run_id,
            render_preview=lambda text: render_preview(text, self.message_limit),
            edit_interval_s=self.settings.stream_edit_interval_s,
            typing_interval_s=self.typing_interval_s,
            preview_timeout_s=self.preview_timeout_s,
            first_preview_delay_s=self.settings.first_preview_delay_s,
            memory=self._previews.memory(run_id, str(chat.chat_id), resumed=resumed),
        )

    async def send_text(self, target: Target, text: str) -> str | None:
        """Send a notice (Markdown allowed); returns the first message id, None if empty."""
        sender = self._require_sender()
        chat = chat_ref(target)
        first: str | None = None
        for index, part in enumerate(self.format_parts(text)):
            message_id = await sender.send(chat, part, reply=index == 0)
            first = first or str(message_id)
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
        body, keyboard = approval_message(approval_id, summary)
        await self._require_sender().send(chat_ref(target), body, reply_markup=keyboard)
