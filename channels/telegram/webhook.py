"""The Telegram webhook endpoint on botd's HTTP server.

Telegram POSTs each update as JSON with the secret given to setWebhook in the
``X-Telegram-Bot-Api-Secret-Token`` header. Requests without it get 401, with a wrong
one 403 (compared in constant time); a body that is not a JSON update gets 400 (so
does one holding a lone surrogate escape such as ``"\\ud800"``: no UTF-8 text can carry
it, nor can anything downstream store it). A body over ``max_body_bytes``, or over the
HTTP server's ``client_max_size`` (also when sent chunked), gets 413. A valid update is
handed over (submitted, never waited on until the run ends) and answered 200 at once;
if handing over fails the answer is 500 so Telegram retries.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from channels.telegram.redact import scrub

log = structlog.get_logger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")

JsonUpdateHandler = Callable[[dict[str, Any]], Awaitable[None]]


class BadUpdate(ValueError):
    """An update that cannot be understood (answered 400)."""


class WebhookIntake:
    """An aiohttp handler for Telegram webhook requests."""

    def __init__(
        self,
        secret: str,
        handle: JsonUpdateHandler,
        *,
        ready: Callable[[], bool] = lambda: True,
        max_body_bytes: int = 1_048_576,
    ) -> None:
        self._secret = secret.encode()
        self.handle = handle
        self.ready = ready
        self.max_body_bytes = max_body_bytes

    async def handle_request(self, request: web.Request) -> web.StreamResponse:
        given = request.headers.get(SECRET_HEADER)
        if given is None:
            log.info("telegram.webhook_rejected", reason="missing secret", remote=request.remote)
            return _answer(401, "missing secret token")
        if not hmac.compare_digest(given.encode(), self._secret):
            log.info("telegram.webhook_rejected", reason="wrong secret", remote=request.remote)
            return _answer(403, "wrong secret token")
        if not self.ready():
            return _answer(503, "not ready")
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            return _answer(413, "body too large")
        try:
            body = await request.read()  # bounded by the server's client_max_size, chunked or not
        except web.HTTPRequestEntityTooLarge:
            return _answer(413, "body too large")
        if len(body) > self.max_body_bytes:
            return _answer(413, "body too large")
        try:
            update = json.loads(body)
        except (ValueError, RecursionError):
            return _answer(400, "body is not valid JSON")
        if not isinstance(update, dict) or not isinstance(update.get("update_id"), int):
            return _answer(400, "body is not a Telegram update (no integer update_id)")
        if _SURROGATE_ESCAPE.search(body) and not _is_unicode(update):
            return _answer(400, "body is not Unicode text (a lone surrogate escape)")
        try:
            await self.handle(update)
        except BadUpdate as exc:
            return _answer(400, str(exc))
        except Exception as exc:
            log.error("telegram.webhook_failed", update_id=update["update_id"], error=scrub(repr(exc)))
            return _answer(500, "could not accept the update, retry later")
        return _answer(200, "ok")


def _is_unicode(data: object) -> bool:
    """Whether every string in ``data`` is valid Unicode (no lone surrogates)."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
        return False
    return True


def _answer(status: int, text: str) -> web.Response:
    return web.json_response({"ok": status == 200, "description": text}, status=status)
