"""The OpenAI-compatible chat model: streaming, bounded retries, a deadline, clean cancellation.

The request goes out as the ``openai`` SDK would send it (``agent.llm_wire``: straight
over ``agent.http`` with the SDK's headers, or through the SDK where only it knows the
way); the SDK's own retries are off so that ours are bounded and visible: failures
*before* the response starts (429, 408/409, 5xx, connection errors, and after the 200
headers an error event, a disconnect or a stream that ends without a finish reason
while no text has gone out) are retried, with exponential backoff or the server's
Retry-After (capped), and never past the call's deadline. An answer with nothing in it
(empty, only reasoning, a body that is no event stream) gets one retry. Once text has
streamed out a failure is final, since deltas may already have reached the chat. A call
without a finish reason never counts as an answer, so a cut answer's text is not kept
and its tool calls never run. Cancelling the calling task closes the HTTP response, so
the server sees the client go.

The contract types live in ``agent.llm_types`` and are re-exported here.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import httpx2
import structlog

from agent.http import HTTPClient, HTTPXClient
from agent.llm_errors import redact, sdk_error, stream_error
from agent.llm_stream import (
    SSEDecoder,
    StreamAssembler,
    check_finished,
    decode_json,
    drain,
    encode_json,
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
from agent.llm_wire import ChatWire
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
    "redact",
]

log = structlog.get_logger(__name__)

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
        # over botd's HTTP client, for what the SDK sends itself (agent.llm_wire).
        http = HTTPClient(max_connections=1000, max_idle_per_origin=100, ssl_context=httpx2.create_ssl_context)
        self._client = openai.AsyncOpenAI(
            api_key=api_key or "no-key",
            base_url=base_url,
            max_retries=0,
            timeout=request_timeout_s,
            http_client=HTTPXClient(http, timeout=request_timeout_s, follow_redirects=True),
        )
        self._wire = ChatWire(self._client, http, request_timeout_s, self._secret)

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

        The body is decoded here, one JSON decode per event, because the SDK's per-chunk
        pydantic model costs several times more CPU than the rest of a turn. The request
        is JSON encoded once, by orjson."""
        answer = await self._wire.open(request)
        assembler = StreamAssembler()
        decoder = SSEDecoder()
        body = answer.chunks(lambda: stream_error(None, started=assembler.started, secret=self._secret))
        try:  # closes the HTTP response on every exit, cancellation included
            async for raw in body:
                if await self._feed(raw, decoder, assembler, on_delta):
                    await drain(body)
                    break
        finally:
            await body.aclose()
            await answer.aclose()
        check_finished(assembler, answer.content_type)
        result = assembler.response(messages, attempts=attempt)
        result.model = result.model or self.model
        return result

    async def _feed(
        self,
        raw: bytes,
        decoder: SSEDecoder,
        assembler: StreamAssembler,
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
                raise stream_error(chunk["error"], started=assembler.started, secret=self._secret)
            for delta in assembler.feed(chunk if isinstance(chunk, dict) else {}):
                if on_delta is not None:
                    await on_delta(delta)
        return False

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
            raise sdk_error(exc, self._secret) from None
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
