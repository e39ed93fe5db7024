"""What a failed model request becomes: one ``LLMError`` kind per cause, with the server's
own words shortened and anything key-like masked.

A request fails either before its answer started (a status, a network failure) or in the
middle of the stream (an error event, a dropped connection). Both ways of sending it
(``agent.llm_wire``: straight over ``agent.http``, or through the SDK) report here, so the
operator reads the same message whichever way the request went.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping
from typing import Any

from agent.llm_types import LLMError
from agent.openai_sdk import openai

_RETRY_STATUSES = frozenset({408, 409, 429})
_KEY_PATTERN = re.compile(r"\b(sk|xox[abpe]|Bearer)[- ][A-Za-z0-9_\-*.]{6,}")
_MAX_DETAIL_CHARS = 200
_CONTEXT_PATTERN = re.compile(
    r"context[ _](length|window)|maximum context|too many tokens|prompt is too long|context too long", re.I
)


def network_error(*, timed_out: bool) -> LLMError:
    """No answer: the request timed out, or the service could not be reached."""
    if timed_out:
        return LLMError("The language model request timed out.", kind="timeout", retryable=True)
    return LLMError("Could not reach the language model service.", kind="connection", retryable=True)


def sdk_error(exc: openai.APIError, secret: str) -> LLMError:
    """The ``LLMError`` for a failure the SDK reported before an answer started."""
    if isinstance(exc, openai.APITimeoutError):
        return network_error(timed_out=True)
    if isinstance(exc, openai.APIConnectionError):  # a timeout is one too: after the check above
        return network_error(timed_out=False)
    if not isinstance(exc, openai.APIStatusError):
        return LLMError("The language model sent an unexpected response.", kind="protocol", retryable=True)
    return status_error(exc.status_code, exc.body, exc.response.headers, secret)


def status_error(status: int, body: Any, headers: Mapping[str, str], secret: str) -> LLMError:
    """The ``LLMError`` for an HTTP error status; ``body`` is the error object the server
    sent (``{"error": {...}}`` unwrapped or not), or its text."""
    detail = error_detail(body, secret)
    said = f": {detail}" if detail else "."
    if status == 429:
        return LLMError(
            f"The language model is rate-limited (HTTP 429){said}",
            kind="rate_limit", retryable=True, status=status, retry_after_s=retry_after_s(headers),
        )
    if status >= 500 or status in _RETRY_STATUSES:
        return LLMError(
            f"The language model service had an error (HTTP {status}){said}",
            kind="server", retryable=True, status=status, retry_after_s=retry_after_s(headers),
        )
    if status in (401, 403):
        return LLMError(
            f"The language model refused the credentials (HTTP {status}); check llm.api_key.",
            kind="auth", retryable=False, status=status,
        )
    if status == 404:
        return LLMError(
            "The language model endpoint or model was not found (HTTP 404); check llm.base_url and llm.model.",
            kind="not_found", retryable=False, status=status,
        )
    return LLMError(
        f"The language model rejected the request (HTTP {status}){said}",
        kind="bad_request", retryable=False, status=status, context_exceeded=_context_exceeded(body, detail),
    )


def stream_error(body: Any, *, started: bool, secret: str) -> LLMError:
    """A failure after the 200 headers: retryable only while no text has gone out."""
    detail = error_detail(body, secret)
    where = "midway" if started else "before the answer started"
    return LLMError(
        f"The language model stream failed {where}" + (f": {detail}" if detail else "."),
        kind="stream", retryable=True, started=started,
    )


def error_detail(body: Any, secret: str) -> str:
    """The server's own error message, shortened and with anything key-like masked."""
    message: Any = None
    if isinstance(body, dict):
        inner = body.get("error")
        message = inner.get("message") if isinstance(inner, dict) else body.get("message")
    elif isinstance(body, str):
        message = body
    if not isinstance(message, str) or not message.strip():
        return ""
    return redact(message.strip(), secret)[:_MAX_DETAIL_CHARS]


def _context_exceeded(body: Any, detail: str) -> bool:
    """Whether a 400 says the conversation is longer than the model's context."""
    inner = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(inner, dict) and inner.get("code") == "context_length_exceeded":
        return True
    return bool(_CONTEXT_PATTERN.search(detail))


def redact(text: str, secret: str = "") -> str:
    """Mask ``secret`` and anything shaped like an API key or token."""
    if secret:
        text = text.replace(secret, "***")
    return _KEY_PATTERN.sub(lambda m: m.group(1) + "-***", text)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The server's requested wait (``retry-after-ms``, ``retry-after`` seconds or HTTP date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            value = float(raw_ms) / 1000
            return value if value >= 0 else None
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        value = float(raw)
        return value if value >= 0 else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
