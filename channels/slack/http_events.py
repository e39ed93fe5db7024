"""The signed HTTP Events API route (``POST <events_path>`` on botd's HTTP server).

Checks, in this order, so that nobody learns anything without the secret: the v0
signature over ``v0:<timestamp>:<body>`` (constant-time, slack_sdk's verifier) and a
timestamp no older (or newer) than five minutes — else 401; then the body must be what
Slack sends (a JSON object for events, a form with ``command`` or a JSON ``payload``
for slash commands and interactivity, with no lone surrogate escape) — else 400. The
request then goes to the bolt app, the same dispatch Socket Mode uses. The listener
submits the event to the gateway *before* the answer (see adapter.py): 200 once it is
accepted, 503 (:data:`NOT_ACCEPTED_STATUS`) when it could not be (Redis down, or no
answer within ``accept_timeout_s``, which keeps the answer inside Slack's 3 seconds), so
that Slack retries it with ``X-Slack-Retry-Num``; the retry is not taken for a duplicate
of what was never accepted (the gateway's dedupe marks a post only once it is stored). Bolt trusts the shape of what it reads out of a
payload (ids, ``actions``, ``event.type``); where a payload breaks that, bolt logs the
error and answers 500, and as every listener here turns its own failures into that 503,
such a 500 can only come from a payload Slack would not send: it is answered 400.
Oversize bodies are refused by the HTTP server itself (``client_max_size``, also for
chunked bodies: the body is read whole).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import parse_qs

import structlog
from aiohttp import web
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.signature import Clock as VerifierClock
from slack_sdk.signature import SignatureVerifier

log = structlog.get_logger(__name__)

MAX_AGE_S = 300
# What a listener answers for a request the gateway did not accept (Slack retries 5xx).
NOT_ACCEPTED_STATUS = 503
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

Dispatch = Callable[[AsyncBoltRequest], Awaitable[BoltResponse]]
Clock = Callable[[], float]


class _Clock(VerifierClock):
    def __init__(self, now: Clock) -> None:
        self._now = now

    def now(self) -> float:
        return self._now()


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"ok": False, "error": message}, status=status)


def check_body(raw: str, content_type: str) -> tuple[str | None, dict[str, Any] | None]:
    """(what is wrong with ``raw``, or None when it has the shape Slack sends; the parsed
    JSON object of an Events API body, or None for a form)."""
    if content_type == "application/json":
        try:
            data: Any = json.loads(raw)
        except (json.JSONDecodeError, RecursionError):
            return "body is not valid JSON", None
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            return "body must be a JSON object with a type", None
        if not _is_unicode(raw, data):
            return "body holds a lone surrogate escape", None
        return None, data
    if content_type == "application/x-www-form-urlencoded":
        try:
            form = parse_qs(raw, keep_blank_values=True, strict_parsing=bool(raw))
        except ValueError:
            return "body is not a valid form", None
        if "payload" in form:
            try:
                payload = json.loads(form["payload"][0])
            except (json.JSONDecodeError, RecursionError):
                return "payload is not valid JSON", None
            if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
                return "payload must be a JSON object with a type", None
            if not _is_unicode(form["payload"][0], payload):
                return "payload holds a lone surrogate escape", None
            return None, None
        if "command" in form or "ssl_check" in form:
            return None, None
        return "form has neither a command nor a payload", None
    return f"unsupported content type {content_type or '(none)'}", None


def _is_unicode(raw: str, data: Any) -> bool:
    """Whether every string in ``data`` (parsed from ``raw``) is valid Unicode.

    ``raw`` itself was decoded as UTF-8, so a lone surrogate can only come from a
    ``\\uD800``-``\\uDFFF`` escape: without one there is nothing to re-encode.
    """
    if not _SURROGATE_ESCAPE.search(raw):
        return True
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
        return False
    return True


class SlackEventsEndpoint:
    """The aiohttp handler; ``accepting`` turns false when the channel stops (503)."""

    def __init__(self, signing_secret: str, dispatch: Dispatch, *, clock: Clock = time.time) -> None:
        self._verifier = SignatureVerifier(signing_secret, _Clock(clock))
        self._dispatch = dispatch
        self._clock = clock
        self.accepting = True

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if not self.accepting:
            return _error(503, "shutting down")
        raw = await request.read()
        problem = self._verify(
            raw, request.headers.get("X-Slack-Request-Timestamp"), request.headers.get("X-Slack-Signature")
        )
        if problem is not None:
            log.warning("slack.http_rejected", reason=problem, remote=request.remote)
            return _error(401, "invalid request signature")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return _error(400, "body is not UTF-8")
        malformed, event_body = check_body(text, request.content_type)
        if malformed is not None:
            log.warning("slack.http_malformed", reason=malformed)
            return _error(400, malformed)
        retry = request.headers.get("X-Slack-Retry-Num")
        if retry:
            log.info(
                "slack.http_retry", retry_num=retry, reason=request.headers.get("X-Slack-Retry-Reason", "")
            )
        headers: dict[str, str | Sequence[str]] = {k.lower(): v for k, v in request.headers.items()}
        try:
            if event_body is not None:  # parsed and checked above; bolt need not parse it again
                # (bolt takes a parsed body only in its socket mode; the mode decides
                # nothing else here, as the signature was verified above)
                bolt_request = AsyncBoltRequest(
                    body=event_body, query=request.query_string, headers=headers, mode="socket_mode"
                )
            else:
                bolt_request = AsyncBoltRequest(body=text, query=request.query_string, headers=headers)
        except Exception as exc:  # bolt reads ids out of the payload, trusting their types
            log.warning("slack.http_malformed", reason=f"bolt cannot read the payload ({type(exc).__name__})")
            return _error(400, "payload is not shaped like Slack's")
        response = await self._dispatch(bolt_request)
        if response.status == NOT_ACCEPTED_STATUS:  # the adapter has logged why
            return _error(NOT_ACCEPTED_STATUS, "not accepted, retry later")
        if response.status >= 500:  # bolt has logged what broke (see the module docstring)
            log.warning("slack.http_malformed", reason="bolt could not dispatch the payload")
            return _error(400, "payload is not shaped like Slack's")
        return web.Response(
            status=response.status,
            body=response.body.encode("utf-8"),
            headers={name: values[0] for name, values in response.headers.items() if values},
        )

    def _verify(self, raw: bytes, timestamp: str | None, signature: str | None) -> str | None:
        if not timestamp or not signature:
            return "missing signature headers"
        try:
            sent_at = int(timestamp)
        except ValueError:
            return "bad timestamp"
        if abs(self._clock() - sent_at) > MAX_AGE_S:
            return "stale timestamp"
        try:
            valid = self._verifier.is_valid(raw, timestamp, signature)
        except UnicodeDecodeError:  # Slack signs UTF-8 bodies only
            valid = False
        if not valid:
            return "bad signature"
        return None
