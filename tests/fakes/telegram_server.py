"""A fake Telegram Bot API server on 127.0.0.1 that the real python-telegram-bot can talk to.

It serves ``/bot<token>/<method>`` with the real wire format: JSON, form-encoded and
multipart bodies (python-telegram-bot sends form fields whose complex values are JSON),
answers ``{"ok": true, "result": ...}`` with realistic Message/User/Chat objects, and
errors ``{"ok": false, "error_code", "description", "parameters"}`` with the HTTP status
Telegram uses. It long-polls getUpdates with offset confirmation and the 409 conflicts
Telegram raises, validates HTML like Telegram does, records every call, and can inject
faults and latency: error answers with any status, malformed ``ok: true`` answers,
connections dropped before or after the call took effect, delays, and a seeded random
mix of all of these (``chaos``).

    async with FakeTelegram() as fake:
        bot = telegram.Bot(fake.token, base_url=fake.base_url)
        fake.push_message(fake.private_message(42, "hi"))
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes.chaos import Chaos
from tests.fakes.telegram_files import FileStore, Upload
from tests.fakes.telegram_html import TelegramHTMLError, parse_telegram_html
from tests.fakes.telegram_updates import SentMessage, UpdateBuilder, auto_entities, utf16_len

__all__ = ["ApiError", "Call", "FakeTelegram", "SentMessage", "auto_entities"]

JSON_FIELDS = {
    "reply_markup",
    "reply_parameters",
    "allowed_updates",
    "commands",
    "entities",
    "caption_entities",
    "link_preview_options",
    "reaction",
    "scope",
}
INT_FIELDS = {"message_id", "offset", "limit", "timeout", "message_thread_id", "max_connections"}
BOOL_FIELDS = {"drop_pending_updates", "disable_notification", "show_alert", "is_big"}

NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup "
    "are exactly the same as a content and reply markup of the current message"
)
TERMINATED = "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
WEBHOOK_ACTIVE = "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first"



class ApiError(Exception):
    """An error answer of the Bot API."""

    def __init__(self, code: int, description: str, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.code = code
        self.description = description
        self.retry_after = retry_after


@dataclass
class Call:
    """One recorded API call."""

    method: str
    params: dict[str, Any]
    at: float  # time.monotonic() when it arrived
    status: int = 200


@dataclass
class Fault:
    """A scripted error for the next ``times`` calls of a method."""

    code: int
    description: str
    retry_after: int | None = None
    times: int = 1
    hang_s: float = 0.0
    kind: str = "error"  # error | malformed | drop | drop_after
    body: Any = None  # the JSON answered by a "malformed" fault


# The faults ``chaos`` draws from: what a flaky Bot API (or a proxy in front of it) answers.
CHAOS_KINDS = ("500", "502", "timeout", "drop", "drop_after", "malformed", "cant_edit", "not_found", "429")
CANT_EDIT = "Bad Request: message can't be edited"
EDIT_NOT_FOUND = "Bad Request: message to edit not found"



@dataclass
class _Poll:
    terminated: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class FakeTelegram(FileStore, UpdateBuilder):
    """The fake Bot API. Use as ``async with FakeTelegram() as fake``."""

    def __init__(
        self,
        token: str = "123456789:AAFakeTokenForTestsOnly_abcdefghijkl",
        *,
        bot_username: str = "botd_test_bot",
        bot_name: str = "botd",
        latency_s: float = 0.0,
    ) -> None:
        self.token = token
        self.bot_id = int(token.split(":", 1)[0])
        self.bot_username = bot_username
        self.bot_name = bot_name
        self.latency_s = latency_s
        self.method_latency: dict[str, float] = {}
        self.calls: list[Call] = []
        self.messages: dict[tuple[int, int], SentMessage] = {}
        self.chats: dict[int, dict[str, Any]] = {}
        self.commands: list[dict[str, str]] = []
        self.webhook_url = ""
        self.webhook_secret: str | None = None
        self.answered_callbacks: list[dict[str, Any]] = []
        self.reactions: list[dict[str, Any]] = []
        self.reject_html: list[str] = []  # HTML containing one of these fails to parse
        self._faults: dict[str, list[Fault]] = {}
        self._chaos = Chaos(CHAOS_KINDS)
        self.ignore_poll_timeout = False  # getUpdates answers at once, as some proxies do
        self.dropped = 0  # connections closed without an answer
        self._updates: list[dict[str, Any]] = []
        self._next_update_id = 500_000
        self._next_message_id: dict[int, int] = {}
        self._next_callback = 9_000
        self._poll: _Poll | None = None
        self._changed = asyncio.Condition()
        self._closing = False
        self._closed = asyncio.Event()
        self.terminated_polls = 0  # getUpdates calls ended by a concurrent one (409)
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._init_files()

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> FakeTelegram:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)  # uploads up to Telegram's 50 MB and over
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        app.router.add_get("/file/bot{token}/{path:.+}", self._serve_file)
        # No access log: it would print the token in every request line.
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets
        self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self._closing = True
        self._closed.set()
        if self._poll is not None:
            self._poll.wake.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def base_url(self) -> str:
        """What to configure as ``telegram.api_base_url`` (the token is appended)."""
        return f"http://127.0.0.1:{self.port}/bot"

    @property
    def bot_user(self) -> dict[str, Any]:
        return {
            "id": self.bot_id,
            "is_bot": True,
            "first_name": self.bot_name,
            "username": self.bot_username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    # -- faults and latency ---------------------------------------------------------------

    def fail_next(
        self, method: str, *, code: int = 400, description: str = "Bad Request", times: int = 1,
        retry_after: int | None = None,
    ) -> None:
        """The next ``times`` calls of ``method`` answer this error."""
        self._faults.setdefault(method, []).append(Fault(code, description, retry_after, times))

    def rate_limit(self, method: str, retry_after: int = 1, times: int = 1) -> None:
        """429 Too Many Requests with ``parameters.retry_after``."""
        self.fail_next(
            method, code=429, description=f"Too Many Requests: retry after {retry_after}", times=times,
            retry_after=retry_after,
        )

    def conflict_next(self, times: int = 1) -> None:
        """409 on the next getUpdates calls, as when another instance polls."""
        self.fail_next("getUpdates", code=409, description=TERMINATED, times=times)

    def hang_next(self, method: str, seconds: float, times: int = 1) -> None:
        """The next calls of ``method`` take ``seconds`` before answering normally."""
        self._faults.setdefault(method, []).append(Fault(0, "", None, times, hang_s=seconds))

    def malformed_next(self, method: str, body: Any = None, *, times: int = 1) -> None:
        """The next calls answer HTTP 200 with ``body`` (default ``{"ok": true, "result": null}``)."""
        answer = {"ok": True, "result": None} if body is None else body
        self._faults.setdefault(method, []).append(Fault(200, "", None, times, kind="malformed", body=answer))

    def drop_next(self, method: str, *, times: int = 1, after_effect: bool = False) -> None:
        """The next calls get their connection closed without an answer, before the call
        took effect or (``after_effect``) after it did, as when a proxy or the network fails."""
        kind = "drop_after" if after_effect else "drop"
        self._faults.setdefault(method, []).append(Fault(0, "", None, times, kind=kind))

    def chaos(
        self, method: str, rate: float, *, kinds: tuple[str, ...] = CHAOS_KINDS, seed: int = 0, hang_s: float = 3.0
    ) -> None:
        """From now on a ``rate`` share of ``method`` calls fail, each in a way drawn from ``kinds``
        (see ``CHAOS_KINDS``; "timeout" hangs ``hang_s`` and then answers normally)."""
        self._chaos.set(method, rate, kinds, seed, hang_s)

    def calm(self, method: str | None = None) -> None:
        """Stop every scripted and random fault (of one method, or all)."""
        self._chaos.clear(method)
        if method is None:
            self._faults.clear()
        else:
            self._faults.pop(method, None)

    def _chaos_fault(self, method: str) -> Fault | None:
        drawn = self._chaos.draw(method)
        if drawn is None:
            return None
        kind, hang_s = drawn
        if kind in ("500", "502"):
            return Fault(int(kind), "Internal Server Error" if kind == "500" else "Bad Gateway")
        if kind == "timeout":
            return Fault(0, "", hang_s=hang_s)
        if kind in ("drop", "drop_after"):
            return Fault(0, "", kind=kind)
        if kind == "malformed":
            return Fault(200, "", kind="malformed", body={"ok": True, "result": None})
        if kind == "cant_edit":
            return Fault(400, CANT_EDIT)
        if kind == "not_found":
            return Fault(400, EDIT_NOT_FOUND)
        return Fault(429, "Too Many Requests: retry after 1", retry_after=1)

    def _take_fault(self, method: str) -> Fault | None:
        queue = self._faults.get(method)
        if not queue:
            return self._chaos_fault(method)
        fault = queue[0]
        fault.times -= 1
        if fault.times <= 0:
            queue.pop(0)
        return fault

    # -- inspection -----------------------------------------------------------------------

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def sent_messages(self, chat_id: int | str | None = None, *, include_deleted: bool = False) -> list[SentMessage]:
        """Messages the bot sent (in send order), optionally in one chat."""
        out = [
            m for m in self.messages.values()
            if m.from_bot and (chat_id is None or m.chat_id == int(chat_id)) and (include_deleted or not m.deleted)
        ]
        return sorted(out, key=lambda m: (m.chat_id, m.message_id))

    async def wait_for(self, predicate: Callable[[], bool], within_s: float = 5.0) -> None:
        """Wait until ``predicate()`` holds (checked after every call); TimeoutError if not."""
        async with asyncio.timeout(within_s), self._changed:
            await self._changed.wait_for(predicate)

    async def wait_calls(self, method: str, count: int = 1, within_s: float = 5.0) -> list[Call]:
        await self.wait_for(lambda: len(self.calls_to(method)) >= count, within_s)
        return self.calls_to(method)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- queueing inbound traffic -------------------------------------------------------------

    def push_update(self, update: dict[str, Any]) -> int:
        """Queue an update for getUpdates (an ``update_id`` is assigned if missing)."""
        if "update_id" not in update:
            self._next_update_id += 1
            update = {"update_id": self._next_update_id, **update}
        else:
            self._next_update_id = max(self._next_update_id, int(update["update_id"]))
        self._updates.append(update)
        if self._poll is not None:
            self._poll.wake.set()
        return int(update["update_id"])

    def push_message(self, message: dict[str, Any], *, kind: str = "message") -> int:
        return self.push_update({kind: message})

    @property
    def pending_updates(self) -> list[dict[str, Any]]:
        return list(self._updates)

    async def deliver_webhook(self, update: dict[str, Any], *, secret: str | None = "<configured>") -> int:
        """POST an update to the registered webhook like Telegram does; returns the HTTP status."""
        if not self.webhook_url:
            raise RuntimeError("no webhook is set")
        if "update_id" not in update:
            self._next_update_id += 1
            update = {"update_id": self._next_update_id, **update}
        headers = {"Content-Type": "application/json"}
        token = self.webhook_secret if secret == "<configured>" else secret
        if token is not None:
            headers["X-Telegram-Bot-Api-Secret-Token"] = token
        async with aiohttp.ClientSession() as session, session.post(
            self.webhook_url, data=json.dumps(update), headers=headers
        ) as resp:
            await resp.read()
            return resp.status

    # -- the HTTP side ------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        try:
            params = await _read_params(request)
        except ValueError as exc:
            return _error(400, f"Bad Request: {exc}")
        call = Call(method, params, time.monotonic())
        self.calls.append(call)
        await self._notify()
        if request.match_info["token"] != self.token:
            call.status = 401
            return _error(401, "Unauthorized")
        delay = self.method_latency.get(method, self.latency_s)
        fault = self._take_fault(method)
        if fault is not None and fault.hang_s:
            delay += fault.hang_s
            fault = None
        if delay:
            with contextlib.suppress(TimeoutError):  # a stopping server ends the wait early
                await asyncio.wait_for(self._closed.wait(), delay)
        if fault is not None and fault.kind == "drop":
            return await self._drop(request, call)
        if fault is not None and fault.kind == "malformed":
            await self._notify()
            return web.json_response(fault.body)
        try:
            if fault is not None and fault.kind == "error":
                raise ApiError(fault.code, fault.description, fault.retry_after)
            handler = getattr(self, f"_m_{method}", None)
            if handler is None:
                raise ApiError(404, "Not Found")
            result = await handler(params)
        except ApiError as err:
            call.status = err.code
            await self._notify()
            return _error(err.code, err.description, err.retry_after)
        if fault is not None and fault.kind == "drop_after":
            return await self._drop(request, call)
        await self._notify()
        return web.json_response({"ok": True, "result": result})

    async def _drop(self, request: web.Request, call: Call) -> web.StreamResponse:
        """Close the connection without an answer (the client sees a dropped connection)."""
        call.status = 0
        self.dropped += 1
        if request.transport is not None:
            request.transport.abort()
        await self._notify()
        return web.Response(status=500)  # never reaches the client

    # -- methods --------------------------------------------------------------------------------

    async def _m_getMe(self, p: dict[str, Any]) -> Any:
        return self.bot_user

    async def _m_logOut(self, p: dict[str, Any]) -> Any:
        return True

    async def _m_getUpdates(self, p: dict[str, Any]) -> Any:
        if self.webhook_url:
            raise ApiError(409, WEBHOOK_ACTIVE)
        if self._poll is not None:
            self._poll.terminated = True
            self._poll.wake.set()
        poll = self._poll = _Poll()
        offset = int(p.get("offset") or 0)
        if offset:
            self._updates = [u for u in self._updates if u["update_id"] >= offset]
        limit = int(p.get("limit") or 100)
        timeout = 0.0 if self.ignore_poll_timeout else float(p.get("timeout") or 0)
        allowed = p.get("allowed_updates") or None
        deadline = time.monotonic() + timeout
        try:
            while True:
                batch = [u for u in self._updates if _allowed(u, allowed)][:limit]
                if batch or self._closing:
                    return batch
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                poll.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(poll.wake.wait(), remaining)
                if poll.terminated:
                    self.terminated_polls += 1
                    raise ApiError(409, TERMINATED)
        finally:
            if self._poll is poll:
                self._poll = None

    async def _m_setWebhook(self, p: dict[str, Any]) -> Any:
        url = str(p.get("url") or "")
        if url and not url.startswith(("https://", "http://127.0.0.1", "http://localhost")):
            raise ApiError(400, "Bad Request: bad webhook: An HTTPS URL must be provided for webhook")
        secret = p.get("secret_token")
        if secret is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", str(secret)):
            raise ApiError(400, "Bad Request: secret token contains unallowed characters")
        self.webhook_url = url
        self.webhook_secret = str(secret) if secret else None
        if p.get("drop_pending_updates"):
            self._updates.clear()
        if self._poll is not None:
            self._poll.terminated = True
            self._poll.wake.set()
        return True

    async def _m_deleteWebhook(self, p: dict[str, Any]) -> Any:
        self.webhook_url = ""
        self.webhook_secret = None
        if p.get("drop_pending_updates"):
            self._updates.clear()
        return True

    async def _m_getWebhookInfo(self, p: dict[str, Any]) -> Any:
        return {"url": self.webhook_url, "has_custom_certificate": False,
                "pending_update_count": len(self._updates)}

    async def _m_setMyCommands(self, p: dict[str, Any]) -> Any:
        commands = p.get("commands")
        if not isinstance(commands, list):
            raise ApiError(400, "Bad Request: can't parse commands JSON object")
        self.commands = [{"command": str(c["command"]), "description": str(c["description"])} for c in commands]
        return True

    async def _m_getMyCommands(self, p: dict[str, Any]) -> Any:
        return self.commands

    async def _m_deleteMyCommands(self, p: dict[str, Any]) -> Any:
        self.commands = []
        return True

    async def _m_sendChatAction(self, p: dict[str, Any]) -> Any:
        self._chat_of(p)
        if not p.get("action"):
            raise ApiError(400, "Bad Request: action is empty")
        return True

    async def _m_answerCallbackQuery(self, p: dict[str, Any]) -> Any:
        if not p.get("callback_query_id"):
            raise ApiError(400, "Bad Request: query is too old and response timeout expired or query ID is invalid")
        self.answered_callbacks.append(p)
        return True

    async def _m_setMessageReaction(self, p: dict[str, Any]) -> Any:
        self._stored(p, "Bad Request: message to react not found")
        self.reactions.append(p)
        return True

    async def _m_deleteMessage(self, p: dict[str, Any]) -> Any:
        stored = self._stored(p, "Bad Request: message to delete not found")
        stored.deleted = True
        return True

    async def _m_sendMessage(self, p: dict[str, Any]) -> Any:
        chat = self._chat_of(p)
        chat_id = int(chat["id"])
        raw = str(p.get("text") or "")
        parse_mode = p.get("parse_mode")
        visible = self._visible(raw, parse_mode)
        thread_id = p.get("message_thread_id")
        reply_to = None
        reply = p.get("reply_parameters")
        if isinstance(reply, dict):
            reply_to = int(reply["message_id"])
            if (chat_id, reply_to) not in self.messages and not reply.get("allow_sending_without_reply"):
                raise ApiError(400, "Bad Request: message to be replied not found")
        msg: dict[str, Any] = {
            "message_id": self._message_id(chat_id), "from": self.bot_user, "chat": chat,
            "date": int(time.time()), "text": visible,
        }
        if thread_id is not None and chat.get("is_forum"):
            msg["message_thread_id"] = int(thread_id)
            msg["is_topic_message"] = True
        if reply_to is not None and (chat_id, reply_to) in self.messages:
            msg["reply_to_message"] = self.messages[(chat_id, reply_to)].data
        markup = p.get("reply_markup")
        if isinstance(markup, dict):
            msg["reply_markup"] = markup
        self.messages[(chat_id, msg["message_id"])] = SentMessage(
            chat_id, msg["message_id"], visible, raw, parse_mode,
            int(thread_id) if thread_id is not None else None, reply_to,
            markup if isinstance(markup, dict) else None, True, msg,
        )
        return msg

    async def _m_editMessageText(self, p: dict[str, Any]) -> Any:
        stored = self._stored(p, "Bad Request: message to edit not found")
        raw = str(p.get("text") or "")
        parse_mode = p.get("parse_mode")
        visible = self._visible(raw, parse_mode)
        markup = p.get("reply_markup") if isinstance(p.get("reply_markup"), dict) else None
        if visible == stored.text and raw == stored.raw and markup == stored.reply_markup:
            raise ApiError(400, NOT_MODIFIED)
        stored.text, stored.raw, stored.parse_mode = visible, raw, parse_mode
        stored.reply_markup = markup
        stored.edits += 1
        stored.data = {**stored.data, "text": visible, "edit_date": int(time.time())}
        if markup is None:
            stored.data.pop("reply_markup", None)
        else:
            stored.data["reply_markup"] = markup
        return stored.data

    async def _m_editMessageReplyMarkup(self, p: dict[str, Any]) -> Any:
        stored = self._stored(p, "Bad Request: message to edit not found")
        markup = p.get("reply_markup") if isinstance(p.get("reply_markup"), dict) else None
        if markup == stored.reply_markup:
            raise ApiError(400, NOT_MODIFIED)
        stored.reply_markup = markup
        stored.data = {**stored.data, "edit_date": int(time.time())}
        stored.data.pop("reply_markup", None)
        if markup:
            stored.data["reply_markup"] = markup
        return stored.data

    # -- helpers -----------------------------------------------------------------------------------

    def _chat_of(self, p: dict[str, Any]) -> dict[str, Any]:
        raw = p.get("chat_id")
        if raw is None or raw == "":
            raise ApiError(400, "Bad Request: chat_id is empty")
        try:
            chat_id = int(raw)
        except (TypeError, ValueError):
            raise ApiError(400, "Bad Request: chat not found") from None
        return self.chat(chat_id)

    def _stored(self, p: dict[str, Any], missing: str) -> SentMessage:
        chat = self._chat_of(p)
        try:
            key = (int(chat["id"]), int(p.get("message_id") or 0))
        except (TypeError, ValueError):
            raise ApiError(400, missing) from None
        stored = self.messages.get(key)
        if stored is None or stored.deleted:
            raise ApiError(400, missing)
        return stored

    def _visible(self, raw: str, parse_mode: Any) -> str:
        if parse_mode == "HTML":
            for needle in self.reject_html:
                if needle in raw:
                    raise ApiError(400, "Bad Request: can't parse entities: Unsupported start tag \"x\" at byte offset 0")
            try:
                visible = parse_telegram_html(raw)
            except TelegramHTMLError as exc:
                raise ApiError(400, f"Bad Request: can't parse entities: {exc}") from None
        elif parse_mode in (None, ""):
            visible = raw
        else:
            raise ApiError(400, f"Bad Request: unsupported parse_mode {parse_mode!r} in this fake")
        if not visible.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        if utf16_len(visible) > 4096:
            raise ApiError(400, "Bad Request: message is too long")
        return visible


def _allowed(update: dict[str, Any], allowed: list[str] | None) -> bool:
    if not allowed:
        return True
    return any(k in update for k in allowed)


def _error(code: int, description: str, retry_after: int | None = None) -> web.Response:
    body: dict[str, Any] = {"ok": False, "error_code": code, "description": description}
    if retry_after is not None:
        body["parameters"] = {"retry_after": retry_after}
    return web.json_response(body, status=code)


async def _read_params(request: web.Request) -> dict[str, Any]:
    """Parameters from the query string and a JSON, form or multipart body, typed like Telegram does."""
    params: dict[str, Any] = dict(request.query)
    if request.can_read_body:
        if request.content_type == "application/json":
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("request body must be a JSON object")
            params.update(body)
            return params
        form = await request.post()
        for key, value in form.items():
            params[key] = value if isinstance(value, str) else Upload(
                value.filename, value.content_type, value.file.read()
            )
    for key, value in list(params.items()):
        if not isinstance(value, str):
            continue
        if key in JSON_FIELDS:
            try:
                params[key] = json.loads(value)
            except ValueError:
                raise ValueError(f"can't parse {key} JSON object") from None
        elif key in INT_FIELDS:
            try:
                params[key] = int(value)
            except ValueError:
                raise ValueError(f"{key} must be a number") from None
        elif key in ("chat_id", "user_id") and re.fullmatch(r"-?\d+", value):
            params[key] = int(value)
        elif key in BOOL_FIELDS:
            params[key] = value.lower() in ("true", "1")
    return params
