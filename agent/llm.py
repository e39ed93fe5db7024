"""The OpenAI-compatible chat model: streaming, bounded retries, a deadline, clean cancellation.

The ``openai`` package makes the requests (over ``agent.http``); its own retries
are off so that ours are bounded and visible: failures *before* the response starts
(429, 408/409, 5xx, connection errors, and after the 200 headers an error event, a
disconnect or a stream that ends without a finish reason while no text has gone out)
are retried, with exponential backoff or the server's Retry-After (capped), and never
past the call's deadline. An answer with nothing in it (empty, only reasoning, a body
that is no event stream) gets one retry. Once text has streamed out a failure is final,
since deltas may already have reached the chat. A call without a finish reason never
counts as an answer, so a cut answer's text is not kept and its tool calls never run.
Cancelling the calling task closes the HTTP response, so the server sees the client go.

The contract types live in ``agent.llm_types`` and are re-exported here.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import httpx2
import structlog

from agent.http import HTTPClient, HTTPXClient
from agent.llm_stream import (
    SSEDecoder,
    StreamAssembler,
    body_bytes,
    check_finished,
    decode_json,
    drain,
    encode_json,
    in_stream_error,
    malformed,
)
from agent.llm_types import (
    ChatModel,
    DeltaCallback,
    LLMError,
    LLMResponse,
    StreamDelta,
    estimate_text_tokens,
    estimate_tokens,
)
from agent.openai_sdk import openai
from agent.types import Message

__all__ = [
    "ChatModel",
    "DeltaCallback",
    "LLMClient",
    "LLMError",
    "LLMResponse",
    "RetryInfo",
    "StreamDelta",
    "estimate_text_tokens",
    "estimate_tokens",
]

log = structlog.get_logger(__name__)

_RETRY_STATUSES = frozenset({408, 409, 429})
_KEY_PATTERN = re.compile(r"\b(sk|xox[abpe]|Bearer)[- ][A-Za-z0-9_\-*.]{6,}")
_MAX_DETAIL_CHARS = 200
_CONTEXT_PATTERN = re.compile(
    r"context[ _](length|window)|maximum context|too many tokens|prompt is too long|context too long", re.I
)


@dataclass(frozen=True, slots=True)
class RetryInfo:
    """One retry about to happen: after ``attempt`` failed with ``error``, wait ``wait_s``."""

    attempt: int
    wait_s: float
    error: LLMError


class LLMClient:
    """A ``ChatModel`` for any OpenAI-compatible ``/chat/completions`` endpoint.

    ``base_url`` None means the OpenAI API itself (which needs an ``api_key``); other
    servers get a placeholder key when none is configured. The output cap is sent as
    ``max_completion_tokens`` to the OpenAI API and as ``max_tokens`` elsewhere, the
    name most compatible servers understand.
    """

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        max_output_tokens: int = 4096,
        request_timeout_s: float = 120.0,
        max_retries: int = 3,
        retry_base_s: float = 0.5,
        retry_cap_s: float = 30.0,
        on_retry: Callable[[RetryInfo], None] | None = None,
    ) -> None:
        if not api_key and base_url is None:
            raise ValueError("llm.api_key (or OPENAI_API_KEY) is required when llm.base_url is not set")
        if request_timeout_s <= 0 or max_retries < 0 or max_output_tokens < 1:
            raise ValueError("request_timeout_s must be > 0, max_retries >= 0 and max_output_tokens >= 1")
        self.model = model
        self.max_output_tokens = max_output_tokens
        self.request_timeout_s = request_timeout_s
        self.max_retries = max_retries
        self.retry_base_s = retry_base_s
        self.retry_cap_s = retry_cap_s
        self.on_retry = on_retry
        self._secret = api_key or ""
        official = base_url is None or urlparse(base_url).hostname == "api.openai.com"
        self._max_tokens_field = "max_completion_tokens" if official else "max_tokens"
        # The SDK's own client settings (redirects followed, proxies from the environment)
        # over botd's HTTP client: less CPU per request than the SDK's aiohttp transport
        # (bench/floor.py).
        http = HTTPClient(max_connections=1000, max_idle_per_origin=100, ssl_context=httpx2.create_ssl_context)
        self._client = openai.AsyncOpenAI(
            api_key=api_key or "no-key",
            base_url=base_url,
            max_retries=0,
            timeout=request_timeout_s,
            http_client=HTTPXClient(http, timeout=request_timeout_s, follow_redirects=True),
        )

    async def aclose(self) -> None:
        """Release the HTTP connection pool."""
        await self._client.close()

    async def complete(
        self,
        messages: Sequence[Message],
        tools: list[dict[str, Any]] | None,
        on_delta: DeltaCallback | None = None,
    ) -> LLMResponse:
        """Stream one answer; raises ``LLMError`` (after retries) or ``CancelledError``."""
        deadline = time.monotonic() + self.request_timeout_s
        try:
            async with asyncio.timeout(self.request_timeout_s):
                return await self._complete(messages, tools, on_delta, deadline)
        except TimeoutError:
            raise LLMError(
                f"The language model did not finish within {self.request_timeout_s:g} s.",
                kind="timeout",
                retryable=True,
            ) from None

    async def _complete(
        self,
        messages: Sequence[Message],
        tools: list[dict[str, Any]] | None,
        on_delta: DeltaCallback | None,
        deadline: float,
    ) -> LLMResponse:
        request = encode_json(self._request(messages, tools))
        attempt = 0
        empty_retried = False
        while True:
            attempt += 1
            try:
                return await self._attempt(request, messages, on_delta, attempt)
            except LLMError as exc:
                error = exc
                wait = self._wait_before_retry(attempt, error, deadline, empty_retried)
                if wait is None:
                    log.warning(
                        "llm.failed", model=self.model, attempt=attempt, kind=error.kind, status=error.status,
                        started=error.started, detail=error.message,
                    )
                    raise
                empty_retried = empty_retried or error.kind == "empty"
            log.info(
                "llm.retry", model=self.model, attempt=attempt, kind=error.kind, status=error.status, wait_s=wait,
                detail=error.message,
            )
            self._report_retry(RetryInfo(attempt=attempt, wait_s=wait, error=error))
            await asyncio.sleep(wait)

    async def _attempt(
        self, request: bytes, messages: Sequence[Message], on_delta: DeltaCallback | None, attempt: int
    ) -> LLMResponse:
        """One request; a complete answer or an ``LLMError`` saying whether output had started.

        The SDK sends the request (headers, auth, status errors) and hands back the open
        HTTP response; the body is decoded here, one JSON decode per event, because the
        SDK's per-request parameter transform and per-chunk pydantic model cost several
        times more CPU than the rest of a turn. The body is JSON encoded once, by orjson."""
        try:
            response = await self._client.post(
                "/chat/completions", cast_to=httpx2.Response, content=request, stream=True, stream_cls=None
            )
        except openai.APIError as exc:
            raise self._error(exc) from None
        assembler = StreamAssembler()
        decoder = SSEDecoder()
        body = body_bytes(response, lambda error: self._stream_error(error, assembler))
        try:  # closes the HTTP response on every exit, cancellation included
            async for raw in body:
                if await self._feed(raw, decoder, assembler, response, on_delta):
                    await drain(body)
                    break
        finally:
            await body.aclose()
            await response.aclose()
        check_finished(assembler, response.headers.get("content-type", ""))
        result = assembler.response(messages, attempts=attempt)
        result.model = result.model or self.model
        return result

    async def _feed(
        self,
        raw: bytes,
        decoder: SSEDecoder,
        assembler: StreamAssembler,
        response: httpx2.Response,
        on_delta: DeltaCallback | None,
    ) -> bool:
        """Decode one piece of the body into the assembler; True once ``[DONE]`` came."""
        try:
            events = decoder.feed(raw)
        except ValueError:
            raise malformed(assembler) from None
        for _event, data in events:
            if data.startswith("[DONE]"):
                return True
            try:
                chunk = decode_json(data)
            except ValueError:  # an SSE event whose data is not JSON
                raise malformed(assembler) from None
            if isinstance(chunk, dict) and chunk.get("error"):
                raise self._stream_error(in_stream_error(chunk["error"], response), assembler)
            for delta in assembler.feed(chunk if isinstance(chunk, dict) else {}):
                if on_delta is not None:
                    await on_delta(delta)
        return False

    def _stream_error(self, exc: openai.APIError, assembler: StreamAssembler) -> LLMError:
        """A failure after the 200 headers: retryable only while no text has gone out."""
        detail = self._detail(exc)
        where = "midway" if assembler.started else "before the answer started"
        return LLMError(
            f"The language model stream failed {where}" + (f": {detail}" if detail else "."),
            kind="stream", retryable=True, started=assembler.started,
        )

    def _report_retry(self, info: RetryInfo) -> None:
        if self.on_retry is None:
            return
        try:
            self.on_retry(info)
        except Exception:
            log.exception("llm.retry_callback_failed")

    async def check(self, timeout_s: float = 10.0) -> list[str]:
        """Ask the endpoint for its models (one attempt, for health checks); raises ``LLMError``."""
        try:
            async with asyncio.timeout(timeout_s):
                page = await self._client.models.list()
        except TimeoutError:
            raise LLMError(
                f"The language model service did not answer within {timeout_s:g} s.", kind="timeout", retryable=True
            ) from None
        except openai.APIError as exc:
            raise self._error(exc) from None
        return [str(m.id) for m in page.data]

    def _request(self, messages: Sequence[Message], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.model,
            "messages": [m.to_openai() for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            self._max_tokens_field: self.max_output_tokens,
        }
        if tools:
            request["tools"] = tools
        return request

    def _wait_before_retry(self, attempt: int, error: LLMError, deadline: float, empty_retried: bool) -> float | None:
        """Seconds to wait before the next attempt, or None when there must be none: the
        error is final, text already reached the caller, the budget or the deadline is
        spent, or an answer came back empty a second time."""
        if not error.retryable or error.started or attempt > self.max_retries:
            return None
        if error.kind == "empty" and empty_retried:
            return None
        if error.retry_after_s is not None:
            wait = min(error.retry_after_s, self.retry_cap_s)
        else:
            wait = min(self.retry_cap_s, self.retry_base_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        if time.monotonic() + wait >= deadline:
            return None
        return wait

    def _error(self, exc: openai.APIError) -> LLMError:
        """The ``LLMError`` for a failure before the stream started, with the operator's detail."""
        if isinstance(exc, openai.APITimeoutError):
            return LLMError("The language model request timed out.", kind="timeout", retryable=True)
        if isinstance(exc, openai.APIConnectionError):  # a timeout is one too: after the check above
            return LLMError("Could not reach the language model service.", kind="connection", retryable=True)
        status = getattr(exc, "status_code", None)
        if not isinstance(status, int):
            return LLMError("The language model sent an unexpected response.", kind="protocol", retryable=True)
        detail = self._detail(exc)
        said = f": {detail}" if detail else "."
        if status == 429:
            return LLMError(
                f"The language model is rate-limited (HTTP 429){said}",
                kind="rate_limit", retryable=True, status=status, retry_after_s=retry_after_s(exc),
            )
        if status >= 500 or status in _RETRY_STATUSES:
            return LLMError(
                f"The language model service had an error (HTTP {status}){said}",
                kind="server", retryable=True, status=status, retry_after_s=retry_after_s(exc),
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
            kind="bad_request", retryable=False, status=status, context_exceeded=_context_exceeded(exc, detail),
        )

    def _detail(self, exc: openai.APIError) -> str:
        """The server's own error message, shortened and with anything key-like masked."""
        body = exc.body
        message: Any = None
        if isinstance(body, dict):
            inner = body.get("error")
            message = inner.get("message") if isinstance(inner, dict) else body.get("message")
        elif isinstance(body, str):
            message = body
        if not isinstance(message, str) or not message.strip():
            return ""
        return redact(message.strip(), self._secret)[:_MAX_DETAIL_CHARS]


def _context_exceeded(exc: openai.APIError, detail: str) -> bool:
    """Whether a 400 says the conversation is longer than the model's context."""
    code = getattr(exc, "code", None)
    if code == "context_length_exceeded":
        return True
    return bool(_CONTEXT_PATTERN.search(detail))


def redact(text: str, secret: str = "") -> str:
    """Mask ``secret`` and anything shaped like an API key or token."""
    if secret:
        text = text.replace(secret, "***")
    return _KEY_PATTERN.sub(lambda m: m.group(1) + "-***", text)


def retry_after_s(exc: openai.APIError) -> float | None:
    """The server's requested wait (``retry-after-ms``, ``retry-after`` seconds or HTTP date)."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
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
