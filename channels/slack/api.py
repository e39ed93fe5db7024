"""Slack Web API calls with Slack's retry rules, logged with the run id.

``ratelimited`` (HTTP 429) waits the ``Retry-After`` Slack asks for and tries again;
transient failures (5xx, ``internal_error``, ``fatal_error``, ``service_unavailable``,
``request_timeout``, connection errors, timeouts) are retried a bounded number of
times with a short backoff; anything else (``channel_not_found``, ``invalid_auth`` …)
fails at once with a :class:`SlackCallError` naming the method and the error code.
A call that makes a message or a file (``chat.postMessage``, ``files.upload_v2``)
whose request may have arrived (no answer in time, the connection closed before one)
is not sent again: it raises :class:`~channels.base.DeliveryUnknown`, since a second
post could show the message twice.
The token never appears in an error or a log line. ``once=True`` makes a single attempt
(previews use it: a preview that fails is given up, not waited for).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlencode

import aiohttp
import structlog
from multidict import CIMultiDict
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.internal_utils import _build_unexpected_body_error_message

from agent.http import HTTPClient, HTTPError, Timeouts, split_url
from channels.base import DeliveryUnknown, may_have_arrived

log = structlog.get_logger(__name__)

TRANSIENT_ERRORS = frozenset(
    {"internal_error", "fatal_error", "service_unavailable", "request_timeout", "ratelimited_retry"}
)
DEFAULT_RETRY_AFTER_S = 1.0
# Calls that make something: sent twice, they show it twice.
CREATING = frozenset({"chat.postMessage", "files.upload_v2"})

Sleep = Callable[[float], Awaitable[None]]


class SlackCallError(Exception):
    """A Web API call that failed for good."""

    def __init__(self, method: str, error: str, status: int | None = None) -> None:
        self.method = method
        self.error = error
        self.status = status
        detail = f" (HTTP {status})" if status not in (None, 200) else ""
        super().__init__(f"slack {method} failed: {error}{detail}")


def _status_of(exc: SlackApiError) -> int | None:
    response = exc.response
    status = getattr(response, "status_code", None)
    if status is None:
        status = getattr(response, "status", None)
    return status if isinstance(status, int) else None


def _error_of(exc: SlackApiError) -> str:
    response = exc.response
    try:
        error = response.get("error")
    except Exception:
        error = None
    return str(error) if error else "unexpected_response"


def retry_after_of(exc: SlackApiError, cap_s: float) -> float:
    """Seconds Slack asked us to wait (``Retry-After``), bounded by ``cap_s``."""
    headers: Mapping[str, Any] = getattr(exc.response, "headers", None) or {}
    raw = None
    for name, value in headers.items():
        if str(name).lower() == "retry-after":
            raw = value
            break
    try:
        seconds = float(raw) if raw is not None else DEFAULT_RETRY_AFTER_S
    except (TypeError, ValueError):
        seconds = DEFAULT_RETRY_AFTER_S
    return min(max(seconds, 0.0), cap_s)


class WebClient(AsyncWebClient):
    """slack_sdk's ``AsyncWebClient`` with its HTTP step over botd's client (``agent.http``).

    The SDK still builds every call (arguments, token, JSON or form body) and turns the
    answer into an ``AsyncSlackResponse``; only the request it would hand aiohttp goes out
    here instead, which spends a fraction of aiohttp's client CPU on it (``bench/floor.py``
    measures the same client under python-telegram-bot). Uploads (files, form objects), a
    proxy or a TLS context of the SDK's own keep its aiohttp path."""

    def __init__(self, *args: Any, http: HTTPClient, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.http = http

    async def _request(self, *, http_verb: str, api_url: str, req_args: dict[str, Any]) -> dict[str, Any]:
        body = _body_of(req_args)
        if body is None or any(req_args.get(key) for key in ("proxy", "ssl", "auth", "files")):
            return await super()._request(http_verb=http_verb, api_url=api_url, req_args=req_args)
        # The method's URL is split once (split_url caches it); a call's own parameters (the
        # SDK sends reactions.add's in the query) join the target, so they never crowd the cache.
        origin, target = split_url(api_url)
        if params := req_args.get("params"):
            target += (b"&" if b"?" in target else b"?") + urlencode(params).encode("ascii")
        headers = [(str(k).encode("latin-1"), str(v).encode("latin-1")) for k, v in req_args["headers"].items()]
        async with asyncio.timeout(self.timeout):  # the SDK's timeout bounds the whole call, as aiohttp's did
            response = await self.http.request(http_verb, (origin, target), headers, body, _WHOLE_CALL_BOUNDED)
            raw = await response.read(_MAX_ANSWER_BYTES)
        answer_headers = CIMultiDict((k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers)
        return {"data": _data_of(raw, answer_headers.get("Content-Type", ""), response),
                "headers": answer_headers, "status_code": response.status}


# A Web API answer is JSON of at most a few MiB (a long conversations.history page).
_MAX_ANSWER_BYTES = 64 << 20
_WHOLE_CALL_BOUNDED = Timeouts(connect=None, read=None, write=None, pool=None)  # by the call's own timeout


def _body_of(req_args: dict[str, Any]) -> bytes | None:
    """The body aiohttp would send for ``req_args``: JSON, a form of strings, or nothing;
    None for anything else (files, a ``FormData``)."""
    if req_args.get("json") is not None:
        return json.dumps(req_args["json"]).encode()
    data = req_args.get("data")
    if data is None:
        return b""
    if isinstance(data, dict) and all(isinstance(v, str | int | float) for v in data.values()):
        return urlencode(data).encode()
    return None


def _data_of(raw: bytes, content_type: str, response: Any) -> dict[str, Any] | bytes | str:
    """The answer as slack_sdk reads it from aiohttp: JSON, text, bytes (a gzip export),
    or nothing for a body of another type; JSON that does not parse is a ``SlackApiError``."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "application/gzip":
        return raw
    if kind == "text/plain":
        return raw.decode("utf-8", "replace")
    if kind != "application/json" and not kind.endswith("+json"):
        return {}
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise SlackApiError(_build_unexpected_body_error_message(raw.decode("utf-8", "replace")), response) from None


class SlackApi:
    """One bot's Web API, over a shared :class:`AsyncWebClient`."""

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        max_retries: int = 3,
        max_rate_limit_waits: int = 5,
        max_retry_after_s: float = 60.0,
        backoff_s: float = 0.5,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.client = client
        self._max_retries = max_retries
        self._max_waits = max_rate_limit_waits
        self._max_retry_after_s = max_retry_after_s
        self._backoff_s = backoff_s
        self._sleep = sleep

    async def call(self, method: str, *, run_id: str = "", once: bool = False, **kwargs: Any) -> dict[str, Any]:
        """Call ``method`` (e.g. ``"chat.postMessage"``) and return Slack's JSON answer."""
        func = getattr(self.client, method.replace(".", "_"), None)
        if func is None:
            raise ValueError(f"unknown Slack method {method!r}")
        failures = 0
        waits = 0
        while True:
            try:
                response = await func(**kwargs)
                data = response.data
                return data if isinstance(data, dict) else {"ok": True}
            except SlackApiError as exc:
                status, error = _status_of(exc), _error_of(exc)
                if status == 429 or error == "ratelimited":
                    waits += 1
                    if once or waits > self._max_waits:
                        raise SlackCallError(method, "ratelimited", status) from None
                    delay = retry_after_of(exc, self._max_retry_after_s)
                    log.warning("slack.ratelimited", method=method, retry_after_s=delay, run_id=run_id)
                    await self._sleep(delay)
                    continue
                if not (error in TRANSIENT_ERRORS or (status is not None and status >= 500)):
                    log.warning("slack.api_error", method=method, error=error, status=status, run_id=run_id)
                    raise SlackCallError(method, error, status) from None
                reason, code = error, status
            except (TimeoutError, aiohttp.ClientError, HTTPError, OSError) as exc:
                reason, code = type(exc).__name__, None
                if not once and method in CREATING and may_have_arrived(exc):
                    log.error("slack.post_unknown", method=method, error=reason, run_id=run_id)
                    raise DeliveryUnknown(f"{method} may have been made: {reason}") from None
            failures += 1
            if once or failures > self._max_retries:
                (log.info if once else log.error)("slack.api_gave_up", method=method, error=reason, attempts=failures, run_id=run_id)
                raise SlackCallError(method, reason, code)
            log.warning("slack.api_retry", method=method, error=reason, attempt=failures, run_id=run_id)
            await self._sleep(self._backoff_s * 2 ** (failures - 1))
