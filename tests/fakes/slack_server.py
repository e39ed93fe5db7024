"""A fake Slack: the Web API (``/api/<method>``) and a Socket Mode websocket, on 127.0.0.1.

It speaks Slack's wire formats, so slack-sdk and slack-bolt run against it unchanged:
form-encoded or JSON bodies with Bearer auth, ``{"ok": …}`` answers, HTTP 429 with
``Retry-After`` for ``ratelimited``, ``apps.connections.open`` returning a ws:// URL whose
socket says ``hello``, carries envelopes and records the acks. Every call is recorded;
faults are scripted per method. Helpers build Events API payloads and sign HTTP
requests with the v0 scheme. Any method can be made to fail in every way: an error
with any HTTP status, a malformed answer, a connection dropped before or after the call
took effect, a delay, or a seeded random mix of these (``chaos``).

    async with FakeSlack() as fake:
        settings = SlackSettings(bot_token=fake.bot_token, api_base_url=fake.api_url, ...)
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from aiohttp import WSMsgType, web

from tests.fakes.chaos import Chaos
from tests.fakes.slack_files import SlackFileStore


@dataclass
class ApiCall:
    method: str
    args: dict[str, Any]
    token: str | None
    at: float = field(default_factory=time.monotonic)
    fault: str = ""  # the fault it met, if any: error | malformed | drop | drop_after | hang


@dataclass
class Fault:
    error: str
    status: int = 200
    retry_after: float | None = None
    remaining: int = 1
    kind: str = "error"  # error | malformed | drop | drop_after | hang
    body: Any = None  # what a "malformed" fault answers (a str is sent as is)
    hang_s: float = 0.0


# The faults ``chaos`` draws from: what a flaky Slack (or a proxy in front of it) answers.
CHAOS_KINDS = ("500", "503", "timeout", "drop", "drop_after", "malformed", "msg_too_long",
               "message_not_found", "ratelimited")



class FakeSlack(SlackFileStore):
    def __init__(
        self,
        *,
        bot_token: str = "xoxb-fake-bot-token",
        app_token: str = "xapp-fake-app-token",
        signing_secret: str = "fake-signing-secret",
        team_id: str = "T0FAKE",
        bot_user_id: str = "UBOT",
        bot_id: str = "BBOT",
        app_id: str = "AFAKE",
        latency_s: float = 0.0,
    ) -> None:
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.team_id = team_id
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.app_id = app_id
        self.latency_s = latency_s
        self.calls: list[ApiCall] = []
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}
        self.reactions: set[tuple[str, str, str]] = set()
        self.acks: dict[str, dict[str, Any]] = {}
        self.socket_connections = 0
        self.refuse_sockets = False  # answer websocket upgrades with 503 while true
        self._faults: dict[str, list[Fault]] = {}
        self._chaos = Chaos(CHAOS_KINDS)
        self.dropped = 0  # connections closed without an answer
        self._ts = itertools.count(1)
        self._sockets: list[web.WebSocketResponse] = []
        self._changed: asyncio.Condition | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._init_files()

    # -- lifecycle --------------------------------------------------------------------
    async def __aenter__(self) -> FakeSlack:
        self._changed = asyncio.Condition()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/socket", self._socket)
        self._add_file_routes(app)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for ws in list(self._sockets):
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    # -- scripting --------------------------------------------------------------------
    def fail(self, method: str, error: str, *, times: int = 1, status: int = 200) -> None:
        """The next ``times`` calls of ``method`` answer ``{"ok": false, "error": error}``."""
        self._faults.setdefault(method, []).append(Fault(error, status, None, times))

    def rate_limit(self, method: str, *, times: int = 1, retry_after: float = 1) -> None:
        """The next ``times`` calls of ``method`` answer 429 ``ratelimited`` with Retry-After."""
        self._faults.setdefault(method, []).append(Fault("ratelimited", 429, retry_after, times))

    def malformed(self, method: str, body: Any = "<html>502 Bad Gateway</html>", *, times: int = 1) -> None:
        """The next calls answer HTTP 200 with ``body`` (a JSON value, or a str sent as is)."""
        self._faults.setdefault(method, []).append(Fault("", 200, None, times, kind="malformed", body=body))

    def drop(self, method: str, *, times: int = 1, after_effect: bool = False) -> None:
        """The next calls get their connection closed without an answer, before the call
        took effect or (``after_effect``) after it did."""
        kind = "drop_after" if after_effect else "drop"
        self._faults.setdefault(method, []).append(Fault("", 0, None, times, kind=kind))

    def hang(self, method: str, seconds: float, *, times: int = 1) -> None:
        """The next calls take ``seconds`` longer, then answer normally."""
        self._faults.setdefault(method, []).append(Fault("", 0, None, times, kind="hang", hang_s=seconds))

    def chaos(
        self, method: str, rate: float, *, kinds: tuple[str, ...] = CHAOS_KINDS, seed: int = 0, hang_s: float = 3.0
    ) -> None:
        """From now on a ``rate`` share of ``method`` calls fail, each in a way drawn from ``kinds``."""
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
        if kind in ("500", "503"):
            return Fault("internal_error" if kind == "500" else "service_unavailable", int(kind))
        if kind == "timeout":
            return Fault("", 0, kind="hang", hang_s=hang_s)
        if kind in ("drop", "drop_after"):
            return Fault("", 0, kind=kind)
        if kind == "malformed":
            return Fault("", 200, kind="malformed", body="<html>502 Bad Gateway</html>")
        if kind == "ratelimited":
            return Fault("ratelimited", 429, retry_after=1)
        return Fault(kind)

    def calls_to(self, method: str) -> list[ApiCall]:
        return [c for c in self.calls if c.method == method]

    async def wait_for(self, predicate: Callable[[], bool], within: float = 5.0) -> None:
        """Wait until ``predicate()`` holds (checked after every call, ack and connection)."""
        assert self._changed is not None
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), within)

    async def wait_calls(self, method: str, count: int = 1, within: float = 5.0) -> list[ApiCall]:
        await self.wait_for(lambda: len(self.calls_to(method)) >= count, within)
        return self.calls_to(method)

    async def _notify(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    # -- Web API ----------------------------------------------------------------------
    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        args: dict[str, Any] = dict(request.query)
        if request.method == "POST" and request.can_read_body:
            if request.content_type == "application/json":
                try:
                    body = await request.json()
                except json.JSONDecodeError:
                    return web.json_response({"ok": False, "error": "invalid_json"})
                if isinstance(body, dict):
                    args.update(body)
            else:
                args.update(dict(await request.post()))
        token = None
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            token = auth[len("Bearer ") :]
        elif "token" in args:
            token = str(args.pop("token"))
        call = ApiCall(method, args, token)
        self.calls.append(call)
        await self._notify()
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        fault = self._take_fault(method)
        call.fault = fault.kind if fault is not None else ""
        if fault is not None and fault.kind == "hang":
            await asyncio.sleep(fault.hang_s)
            fault = None
        if fault is not None and fault.kind == "drop":
            return await self._drop(request)
        if fault is not None and fault.kind == "malformed":
            if isinstance(fault.body, str):
                return web.Response(text=fault.body, content_type="text/html")
            return web.json_response(fault.body)
        if fault is not None and fault.kind == "error":
            headers = {"Retry-After": str(int(fault.retry_after))} if fault.retry_after is not None else {}
            return web.json_response(
                {"ok": False, "error": fault.error}, status=fault.status, headers=headers
            )
        expected = self.app_token if method == "apps.connections.open" else self.bot_token
        if token is None:
            return web.json_response({"ok": False, "error": "not_authed"})
        if token != expected:
            return web.json_response({"ok": False, "error": "invalid_auth"})
        handler = getattr(self, "_m_" + method.replace(".", "_"), None)
        if handler is None:
            return web.json_response({"ok": False, "error": "unknown_method"}, status=404)
        result: dict[str, Any] = handler(args)
        if fault is not None and fault.kind == "drop_after":
            return await self._drop(request)
        return web.json_response(result)

    async def _drop(self, request: web.Request) -> web.StreamResponse:
        """Close the connection without an answer (the client sees a dropped connection)."""
        self.dropped += 1
        if request.transport is not None:
            request.transport.abort()
        await self._notify()
        return web.Response(status=500)  # never reaches the client

    def _take_fault(self, method: str) -> Fault | None:
        queue = self._faults.get(method)
        if not queue:
            return self._chaos_fault(method)
        fault = queue[0]
        fault.remaining -= 1
        if fault.remaining <= 0:
            queue.pop(0)
        return fault

    def _next_ts(self) -> str:
        n = next(self._ts)
        return f"{1_700_000_000 + n}.{n:06d}"

    @staticmethod
    def _blocks(args: dict[str, Any]) -> Any:
        blocks = args.get("blocks")
        if isinstance(blocks, str):
            try:
                return json.loads(blocks)
            except json.JSONDecodeError:
                return None
        return blocks

    def _m_auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "url": "https://fake.slack.com/",
            "team": "Fake Team",
            "user": "botd",
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    def _m_apps_connections_open(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "url": f"ws://127.0.0.1:{self.port}/socket?ticket={uuid.uuid4().hex}"}

    def _m_chat_postMessage(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = str(args.get("channel") or "")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        text = args.get("text")
        blocks = self._blocks(args)
        if not text and not blocks:
            return {"ok": False, "error": "no_text"}
        if text and len(str(text)) > 40000:
            return {"ok": False, "error": "msg_too_long"}
        ts = self._next_ts()
        message = {
            "type": "message",
            "user": self.bot_user_id,
            "bot_id": self.bot_id,
            "text": text or "",
            "ts": ts,
        }
        if blocks:
            message["blocks"] = blocks
        if args.get("thread_ts"):
            message["thread_ts"] = str(args["thread_ts"])
        self.messages[(channel, ts)] = message
        return {"ok": True, "channel": channel, "ts": ts, "message": message}

    def _m_chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        channel, ts = str(args.get("channel") or ""), str(args.get("ts") or "")
        message = self.messages.get((channel, ts))
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        if "text" in args:
            message["text"] = args["text"]
        blocks = self._blocks(args)
        if blocks is not None:
            message["blocks"] = blocks
        return {"ok": True, "channel": channel, "ts": ts, "text": message["text"], "message": message}

    def _m_chat_delete(self, args: dict[str, Any]) -> dict[str, Any]:
        channel, ts = str(args.get("channel") or ""), str(args.get("ts") or "")
        if self.messages.pop((channel, ts), None) is None:
            return {"ok": False, "error": "message_not_found"}
        return {"ok": True, "channel": channel, "ts": ts}

    def _m_reactions_add(self, args: dict[str, Any]) -> dict[str, Any]:
        key = (str(args.get("channel")), str(args.get("timestamp")), str(args.get("name")))
        if key in self.reactions:
            return {"ok": False, "error": "already_reacted"}
        self.reactions.add(key)
        return {"ok": True}

    def _m_reactions_remove(self, args: dict[str, Any]) -> dict[str, Any]:
        key = (str(args.get("channel")), str(args.get("timestamp")), str(args.get("name")))
        if key not in self.reactions:
            return {"ok": False, "error": "no_reaction"}
        self.reactions.discard(key)
        return {"ok": True}

    # -- Socket Mode ------------------------------------------------------------------
    async def _socket(self, request: web.Request) -> web.StreamResponse:
        if self.refuse_sockets:
            return web.Response(status=503, text="try later")
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._sockets.append(ws)
        self.socket_connections += 1
        await ws.send_json(
            {
                "type": "hello",
                "num_connections": len(self._sockets),
                "debug_info": {"host": "fake-slack", "build_number": 1, "approximate_connection_time": 18060},
                "connection_info": {"app_id": self.app_id},
            }
        )
        await self._notify()
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    data = json.loads(msg.data)
                except json.JSONDecodeError:
                    continue
                if isinstance(data, dict) and "envelope_id" in data:
                    self.acks[str(data["envelope_id"])] = data
                    await self._notify()
        finally:
            self._sockets.remove(ws)
            await self._notify()
        return ws

    @property
    def connected(self) -> bool:
        return any(not ws.closed for ws in self._sockets)

    async def wait_connected(self, within: float = 5.0) -> None:
        await self.wait_for(lambda: self.connected, within)

    async def send_envelope(self, kind: str, payload: dict[str, Any], *, retry_attempt: int = 0) -> str:
        """Push one envelope (``events_api``, ``slash_commands``, ``interactive``) to the app."""
        live = [ws for ws in self._sockets if not ws.closed]
        if not live:
            raise RuntimeError("no Socket Mode connection")
        envelope_id = uuid.uuid4().hex
        envelope: dict[str, Any] = {
            "envelope_id": envelope_id,
            "payload": payload,
            "type": kind,
            "accepts_response_payload": kind != "events_api",
        }
        if kind == "events_api":
            envelope["retry_attempt"] = retry_attempt
            envelope["retry_reason"] = "timeout" if retry_attempt else ""
        await live[-1].send_json(envelope)
        return envelope_id

    async def push_event(
        self, event: dict[str, Any], *, event_id: str | None = None, retry_attempt: int = 0
    ) -> str:
        body = event_callback(
            event, team_id=self.team_id, app_id=self.app_id, event_id=event_id, bot_user_id=self.bot_user_id
        )
        return await self.send_envelope("events_api", body, retry_attempt=retry_attempt)

    async def wait_ack(self, envelope_id: str, within: float = 5.0) -> dict[str, Any]:
        await self.wait_for(lambda: envelope_id in self.acks, within)
        return self.acks[envelope_id]

    async def send_disconnect(self) -> None:
        for ws in [w for w in self._sockets if not w.closed]:
            await ws.send_json({"type": "disconnect", "reason": "refresh_requested"})


# -- payload builders ---------------------------------------------------------------------

_event_ids = itertools.count(1)


def event_callback(
    event: dict[str, Any],
    *,
    team_id: str,
    app_id: str = "AFAKE",
    event_id: str | None = None,
    bot_user_id: str = "UBOT",
) -> dict[str, Any]:
    """The Events API body (``event_callback``) around one event."""
    return {
        "token": "legacy-verification-token",
        "team_id": team_id,
        "api_app_id": app_id,
        "event": {"team": team_id, **event},
        "type": "event_callback",
        "event_id": event_id or f"Ev{next(_event_ids):08d}{uuid.uuid4().hex[:4].upper()}",
        "event_time": int(time.time()),
        "authorizations": [{"team_id": team_id, "user_id": bot_user_id, "is_bot": True}],
    }


def message_event(
    text: str,
    *,
    channel: str,
    user: str,
    ts: str,
    channel_type: str = "channel",
    thread_ts: str | None = None,
    kind: str = "message",
    **extra: Any,
) -> dict[str, Any]:
    """A ``message`` (or, with ``kind="app_mention"``, an ``app_mention``) event."""
    event: dict[str, Any] = {
        "type": kind,
        "user": user,
        "text": text,
        "ts": ts,
        "channel": channel,
        "event_ts": ts,
    }
    if kind == "message":
        event["channel_type"] = channel_type
    if thread_ts is not None:
        event["thread_ts"] = thread_ts
    event.update(extra)
    return event


def slash_command(
    text: str, *, channel: str, user: str, team_id: str, command: str = "/botd", user_name: str = "someone"
) -> dict[str, str]:
    """The fields of a slash command request (form-encoded over HTTP, a dict over the socket)."""
    return {
        "token": "legacy-verification-token",
        "team_id": team_id,
        "team_domain": "fake",
        "channel_id": channel,
        "channel_name": "general",
        "user_id": user,
        "user_name": user_name,
        "command": command,
        "text": text,
        "api_app_id": "AFAKE",
        "response_url": "https://hooks.slack.invalid/commands/x",
        "trigger_id": f"{uuid.uuid4().int % 10**10}.{uuid.uuid4().hex[:8]}",
    }


def block_action(
    action_id: str,
    value: str,
    *,
    user: str,
    channel: str,
    team_id: str,
    message_ts: str,
    thread_ts: str | None = None,
    message: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``block_actions`` payload for one button press on a message."""
    msg = dict(message or {"type": "message", "ts": message_ts, "text": "", "blocks": []})
    msg.setdefault("ts", message_ts)
    container: dict[str, Any] = {
        "type": "message",
        "message_ts": message_ts,
        "channel_id": channel,
        "is_ephemeral": False,
    }
    if thread_ts is not None:
        msg.setdefault("thread_ts", thread_ts)
        container["thread_ts"] = thread_ts
    return {
        "type": "block_actions",
        "user": {"id": user, "username": "someone", "name": "someone", "team_id": team_id},
        "api_app_id": "AFAKE",
        "token": "legacy-verification-token",
        "container": container,
        "trigger_id": f"{uuid.uuid4().int % 10**10}.{uuid.uuid4().hex[:8]}",
        "team": {"id": team_id, "domain": "fake"},
        "channel": {"id": channel, "name": "general"},
        "message": msg,
        "response_url": "https://hooks.slack.invalid/actions/x",
        "actions": [
            {
                "action_id": action_id,
                "block_id": "botd_approval",
                "text": {"type": "plain_text", "text": action_id},
                "value": value,
                "type": "button",
                "action_ts": f"{time.time():.6f}",
            }
        ],
    }


# -- HTTP signing -------------------------------------------------------------------------


def sign(body: bytes, secret: str, timestamp: int | None = None) -> dict[str, str]:
    """Slack's v0 signature headers for ``body``."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    digest = hmac.new(secret.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={digest}"}


def signed_json(
    payload: dict[str, Any], secret: str, timestamp: int | None = None
) -> tuple[bytes, dict[str, str]]:
    """An Events API request: JSON body and its headers."""
    body = json.dumps(payload).encode()
    return body, {"Content-Type": "application/json", **sign(body, secret, timestamp)}


def signed_form(
    fields: dict[str, str], secret: str, timestamp: int | None = None
) -> tuple[bytes, dict[str, str]]:
    """A slash command or interactivity request: form-encoded body and its headers."""
    body = urlencode(fields).encode()
    return body, {"Content-Type": "application/x-www-form-urlencoded", **sign(body, secret, timestamp)}


def signed_interactive(
    payload: dict[str, Any], secret: str, timestamp: int | None = None
) -> tuple[bytes, dict[str, str]]:
    return signed_form({"payload": json.dumps(payload)}, secret, timestamp)
