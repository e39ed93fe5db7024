"""The Slack channel: slack-bolt's AsyncApp inside botd's event loop.

Inbound, Socket Mode (``AsyncSocketModeHandler``) and HTTP Events (our signed route,
http_events.py) both feed ``AsyncApp.async_dispatch``; its listeners hand events to
intake.py and slash commands / approval buttons to commands.py, which submit
RunRequests and never wait for a run. Outbound goes through api.py (rate limits,
retries) and stream.py. ``auth.test`` at start tells who the bot is; bolt gets that
result through ``authorize`` so it makes no extra calls per request.

Accept, then acknowledge (acceptance.py): a listener submits before bolt acknowledges,
and answers "not accepted" when the gateway does not take the request in time. The same
holds for slash commands and approval buttons (Slack shows the person an error instead
of retrying those); the approval message is updated in the background after the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.response import BoltResponse
from slack_sdk.web.async_client import AsyncWebClient

from agent.http import HTTPClient
from agent.types import Attachment
from channels.base import (
    ChannelContext,
    ChannelStartError,
    FileSink,
    PairingGate,
    Target,
)
from channels.preview_memory import PreviewBook
from channels.slack.acceptance import AcceptGate, Observer, not_accepted
from channels.slack.access import AccessPolicy
from channels.slack.api import SlackApi, SlackCallError, WebClient
from channels.slack.approval import approval_decided, approval_prompt
from channels.slack.commands import APPROVE_ACTION, DENY_ACTION, ApprovalAnswer, CommandIntake, sender_of
from channels.slack.files import SlackFiles
from channels.slack.format import format_parts, preview_part
from channels.slack.http_events import SlackEventsEndpoint
from channels.slack.intake import BotIdentity, Outcome, SlackIntake
from channels.slack.settings import SlackSettings
from channels.slack.stream import SlackReplyStream

log = structlog.get_logger(__name__)

WEB_LOGGER = "botd.slack.web"
DRAIN_TIMEOUT_S = 5.0

_TOKEN_ERRORS = frozenset({"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired"})


def web_logger() -> logging.Logger:
    """The Web API clients' logger, with its own level set to the effective one.

    slack_sdk decides whether to build its per-call debug lines (URL, params, headers,
    body) from ``logger.level`` alone; a logger left at NOTSET (0) passes that test, so
    every call would format them only for logging to drop them.
    """
    logger = logging.getLogger(WEB_LOGGER)
    logger.setLevel(logging.NOTSET)  # inherit the configured level, as of this start
    logger.setLevel(logger.getEffectiveLevel())
    return logger


class SlackStartError(ChannelStartError):
    """The channel could not start (bad token, Slack unreachable); the message says why."""

    @classmethod
    def of(cls, exc: SlackCallError, key: str) -> SlackStartError:
        if exc.error in _TOKEN_ERRORS:
            return cls(f"Slack {exc.method} failed: {exc.error} (check slack.{key})")
        return cls(
            f"Slack {exc.method} failed: {exc.error} (is the Slack API (slack.api_base_url) reachable?)", exit_code=1
        )


class SlackChannel:
    """botd's Slack adapter (implements ``channels.base.ChannelAdapter``)."""

    name = "slack"

    def __init__(self, settings: SlackSettings, *, observer: Observer | None = None) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None
        self._http: HTTPClient | None = None  # the Web API calls (uploads and Socket Mode: _session)
        self._api: SlackApi | None = None
        self._files: SlackFiles | None = None
        self._identity: BotIdentity | None = None
        self._intake: SlackIntake | None = None
        self._commands: CommandIntake | None = None
        self._pairing: PairingGate | None = None
        self._app: AsyncApp | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self._connect_task: asyncio.Task[None] | None = None
        self._endpoint: SlackEventsEndpoint | None = None
        self._previews = PreviewBook(None, "slack")  # until started: remembers nothing
        self._gate = AcceptGate(settings.max_concurrent_intake, observer)

    # -- lifecycle --------------------------------------------------------------------
    @property
    def identity(self) -> BotIdentity:
        if self._identity is None:
            raise RuntimeError("the Slack channel is not started")
        return self._identity

    @property
    def api(self) -> SlackApi:
        if self._api is None:
            raise RuntimeError("the Slack channel is not started")
        return self._api

    async def start(self, ctx: ChannelContext) -> None:
        if self._session is not None:
            raise RuntimeError("the Slack channel is already started")
        s = self.settings
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=s.api_timeout_s))
        self._http = HTTPClient(max_connections=100, max_idle_per_origin=32)
        try:
            await self._start(ctx)
        except BaseException:
            await self.stop()
            raise

    async def _start(self, ctx: ChannelContext) -> None:
        s = self.settings
        self._previews = PreviewBook(ctx.kv, "slack")
        assert self._session is not None and self._http is not None
        client = WebClient(
            token=s.bot_token,
            base_url=s.base_url,
            http=self._http,
            session=self._session,
            timeout=int(s.api_timeout_s),
            retry_handlers=[],
            logger=web_logger(),
        )
        self._api = SlackApi(client, max_retries=s.api_max_retries)
        self._files = SlackFiles(self._api, self._session, s.bot_token, s.base_url)
        try:
            auth = await self._api.call("auth.test")
        except SlackCallError as exc:
            raise SlackStartError.of(exc, "bot_token") from None
        self._identity = BotIdentity(
            team_id=str(auth.get("team_id") or ""),
            user_id=str(auth.get("user_id") or ""),
            bot_id=str(auth.get("bot_id") or ""),
        )
        policy = AccessPolicy.of(s.allow_from, s.channels, dm_open=s.dm_policy == "open")
        self._pairing = ctx.pairing if s.dm_policy == "pairing" else None
        self._intake = SlackIntake(
            ctx, self._identity, policy, require_mention=s.require_mention, pairing=self._pairing
        )
        self._commands = CommandIntake(ctx, policy, self._identity.team_id)
        self._app = self._build_app(auth)
        if s.mode == "socket":
            await self._connect_socket()
        else:
            assert s.signing_secret is not None
            self._endpoint = SlackEventsEndpoint(s.signing_secret, self._app.async_dispatch)
            ctx.add_route("POST", s.events_path, self._endpoint.handle)
        log.info("slack.started", mode=s.mode, team=self._identity.team_id, bot_user=self._identity.user_id)

    def _build_app(self, auth: dict[str, Any]) -> AsyncApp:
        s = self.settings
        result = AuthorizeResult(
            enterprise_id=auth.get("enterprise_id"),
            team_id=auth.get("team_id"),
            team=auth.get("team"),
            url=auth.get("url"),
            bot_id=auth.get("bot_id"),
            bot_user_id=auth.get("user_id"),
            bot_token=s.bot_token,
        )

        async def authorize() -> AuthorizeResult:
            return result

        # No token on bolt's own client: requests are authorized through ``authorize``.
        bolt_client = AsyncWebClient(
            base_url=s.base_url, session=self._session, retry_handlers=[], logger=web_logger()
        )
        app = AsyncApp(
            name="botd",
            client=bolt_client,
            authorize=authorize,
            request_verification_enabled=False,  # the HTTP route verifies before dispatch
            process_before_response=True,  # acknowledge only what was accepted (module docstring)
            logger=logging.getLogger("botd.slack.bolt"),
        )
        app.event(re.compile(r".+"))(self._on_event)
        app.command(re.compile(r"^/.+"))(self._on_command)
        app.action(re.compile(f"^({APPROVE_ACTION}|{DENY_ACTION})$"))(self._on_action)
        return app

    async def _connect_socket(self) -> None:
        s = self.settings
        assert self._app is not None and s.app_token is not None
        try:
            opened = await self.api.call("apps.connections.open", app_token=s.app_token)
        except SlackCallError as exc:
            raise SlackStartError(
                f"Slack apps.connections.open failed: {exc.error} (check slack.app_token)"
            ) from None
        self._socket = AsyncSocketModeHandler(
            self._app,
            app_token=s.app_token,
            web_client=self._app.client,
            ping_interval=s.socket_ping_interval_s,
            logger=logging.getLogger("botd.slack.socket"),
        )
        self._socket.client.wss_uri = str(opened["url"])
        self._connect_task = asyncio.create_task(self._socket.connect_async(), name="slack-socket-connect")
        await asyncio.wait({self._connect_task}, timeout=s.connect_timeout_s)
        if not self.is_ready():
            # The client keeps trying in the background; readiness reports it meanwhile.
            log.warning("slack.socket_not_connected_yet", timeout_s=s.connect_timeout_s)

    async def stop(self) -> None:
        if self._endpoint is not None:
            self._endpoint.accepting = False
        if self._socket is not None:
            with contextlib.suppress(Exception):
                await self._socket.close_async()
            self._socket = None
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()
            await asyncio.gather(self._connect_task, return_exceptions=True)
        await self.drain(DRAIN_TIMEOUT_S)
        self._gate.cancel_all()
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def aclose(self) -> None:
        """Nothing left to release: :meth:`stop` already closed the Slack clients."""

    def is_ready(self) -> bool:
        if self._session is None or self._identity is None:
            return False  # not started, or stopped
        if self.settings.mode == "http":
            return self._endpoint is not None and self._endpoint.accepting
        socket = self._socket
        if socket is None:
            return False
        session = socket.client.current_session
        return not socket.client.closed and session is not None and not session.closed

    async def drain(self, within_s: float = DRAIN_TIMEOUT_S) -> None:
        """Wait (bounded) for inbound requests being handled right now (and their follow-ups)."""
        await self._gate.drain(within_s)

    # -- inbound ----------------------------------------------------------------------
    async def _paired(self, user_id: str) -> bool:
        """Whether pairing approved this user; fails closed when the store does not answer."""
        if self._pairing is None or not user_id:
            return False
        try:
            return await self._pairing.is_approved(user_id)
        except Exception as exc:
            log.warning("slack.pairing_unavailable", error=str(exc))
            return False

    async def _on_event(self, body: dict[str, Any]) -> BoltResponse | None:
        assert self._intake is not None
        intake = self._intake
        outcome = await self._gate.accept("event", lambda: intake.on_event(body), self.settings.accept_timeout_s)
        return None if outcome.accepted else not_accepted(outcome)  # None: bolt acks

    async def _on_command(self, ack: AsyncAck, body: dict[str, Any]) -> BoltResponse | None:
        assert self._commands is not None
        plan = self._commands.plan_command(body, paired=await self._paired(sender_of(body)))

        async def work() -> Outcome:
            assert self._commands is not None
            result = await self._commands.run_command(plan)
            if result is None:
                return Outcome("denied" if plan.rejected == "denied" else "ignored", plan.rejected)
            return Outcome.of(result)

        outcome = await self._gate.accept("command", work, self.settings.accept_timeout_s)
        if not outcome.accepted:
            return not_accepted(outcome)
        await ack(text=plan.ack_text, response_type="ephemeral")
        return None

    async def _on_action(self, ack: AsyncAck, body: dict[str, Any]) -> BoltResponse | None:
        outcome = await self._gate.accept(
            "action", lambda: self._answer_approval(body), self.settings.accept_timeout_s
        )
        if not outcome.accepted:
            return not_accepted(outcome)
        await ack()
        return None

    async def _answer_approval(self, body: dict[str, Any]) -> Outcome:
        assert self._commands is not None
        answer = self._commands.parse_approval(body, paired=await self._paired(sender_of(body)))
        if answer is None:
            return Outcome("ignored", "not_admitted")
        result = await self._commands.submit_approval(answer)
        if result.status in ("command", "queued"):
            self._gate.spawn(self._mark_decided(answer))  # a Slack API call: not before the answer
        return Outcome.of(result)

    async def _mark_decided(self, answer: ApprovalAnswer) -> None:
        """Replace the approval prompt's buttons with who decided what."""
        text, blocks = approval_decided(answer.message, answer.decision, answer.user)
        try:
            await self.api.call(
                "chat.update", channel=answer.channel, ts=answer.message_ts, text=text, blocks=blocks
            )
        except SlackCallError as exc:
            log.warning("slack.approval_update_failed", approval_id=answer.approval_id, error=exc.error)
        except Exception as exc:  # a background task: nobody else would see it
            log.warning("slack.approval_update_failed", approval_id=answer.approval_id, error=repr(exc))

    # -- outbound ---------------------------------------------------------------------
    def format_parts(self, markdown: str) -> list[str]:
        return format_parts(markdown)

    def open_stream(self, target: Target, run_id: str, *, resumed: bool = True) -> SlackReplyStream:
        return SlackReplyStream(
            self.api, target, run_id, format_preview=preview_part, interval_s=self.settings.preview_interval_s,
            first_preview_delay_s=self.settings.first_preview_delay_s,
            memory=self._previews.memory(run_id, target.chat_id, resumed=resumed),
        )

    async def send_text(self, target: Target, text: str) -> str | None:
        first: str | None = None
        for part in format_parts(text):
            args: dict[str, Any] = {"channel": target.chat_id, "text": part}
            if target.thread_id:
                args["thread_ts"] = target.thread_id
            data = await self.api.call("chat.postMessage", **args)
            first = first or str(data["ts"])
        return first

    async def download(self, attachment: Attachment, sink: FileSink, max_bytes: int) -> tuple[int, str]:
        if self._files is None:
            raise RuntimeError("the Slack channel is not started")
        return await self._files.download(attachment, sink, max_bytes)

    async def send_file(self, target: Target, path: Path, caption: str | None) -> str | None:
        if self._files is None:
            raise RuntimeError("the Slack channel is not started")
        return await self._files.send(target, path, caption)

    async def ask_approval(self, target: Target, approval_id: str, summary: str) -> None:
        text, blocks = approval_prompt(approval_id, summary)
        args: dict[str, Any] = {"channel": target.chat_id, "text": text, "blocks": blocks}
        if target.thread_id:
            args["thread_ts"] = target.thread_id
        await self.api.call("chat.postMessage", **args)
