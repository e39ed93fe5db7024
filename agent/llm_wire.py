"""Sending the chat request: straight over ``agent.http`` with the SDK's headers, or
through the SDK itself where only it knows the way.

The ``openai`` SDK's request layer (its options model, URL and header merging, httpx2's
client) costs several times the CPU of the request itself: ``bench/llm_request.py``
measures a request sent straight over ``agent.http`` at about a third of one sent
through the SDK, on the same wire. So the SDK is asked once, when the client is made,
for what it would send (the endpoint, its default and auth headers), and each request
goes out with exactly that. Where the SDK would do more than that, the SDK sends the
request itself:

- a proxy from the environment (``HTTP(S)_PROXY``, ``ALL_PROXY``);
- auth of its own (a token provider, workload identity);
- a query in the base URL, or a default one;
- a header that cannot go out as it is;
- for good, once the endpoint answers with a redirect or a compressed stream (the SDK
  follows the one and decodes the other).

Either way the caller gets an :class:`OpenAnswer`: the body's bytes, its content type
and a way to let go of it. Failures come out as ``LLMError`` (``agent.llm_errors``).
"""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.request
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

import anyio
import httpx2
import structlog

from agent.http import HTTPClient, HTTPError, HTTPTimeout, Timeouts, split_url
from agent.http.client import Response
from agent.http.connection import Origin, request_head
from agent.llm_errors import network_error, sdk_error, status_error
from agent.llm_types import LLMError
from agent.openai_sdk import openai

log = structlog.get_logger(__name__)

# What reading the body can raise on a network failure (the SDK's path maps them alike).
_NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    HTTPError, httpx2.RequestError, ssl.SSLError, anyio.EndOfStream,
)
MAX_ERROR_BODY = 1 << 20  # an error status's body is read up to this, for its message

BrokenStream = Callable[[], LLMError]  # the error for a stream that broke off, made by the caller


class OpenAnswer:
    """An answer whose 2xx status and headers arrived; its body is still to be read."""

    def __init__(self, content_type: str, body: AsyncIterator[bytes], close: Callable[[], Awaitable[None]]) -> None:
        self.content_type = content_type
        self._body = body
        self.aclose = close

    def chunks(self, broken: BrokenStream) -> AsyncGenerator[bytes, None]:
        """The body's bytes; a network failure raises ``broken()``."""
        return _chunks(self._body, broken)


class ChatWire:
    """Where one model client's chat requests go, and how."""

    def __init__(self, sdk: openai.AsyncOpenAI, http: HTTPClient, timeout_s: float, secret: str) -> None:
        self._sdk = sdk
        self._http = http
        self._secret = secret
        self._timeouts = Timeouts(connect=timeout_s, read=timeout_s, write=timeout_s, pool=timeout_s)
        self._url = str(sdk.base_url).rstrip("/") + "/chat/completions"
        self._direct = self._direct_route()

    @property
    def direct(self) -> bool:
        """Whether requests go straight over ``agent.http`` (False: through the SDK)."""
        return self._direct is not None

    def _direct_route(self) -> tuple[tuple[Origin, bytes], list[tuple[bytes, bytes]]] | None:
        """(origin and target, headers) for sending straight, or None when the SDK must send."""
        sdk = self._sdk
        if sdk.base_url.query or sdk.base_url.fragment:
            return None  # the SDK knows how a path joins a base with a query
        try:
            origin, target = split_url(self._url)
        except ValueError:
            return None  # not a URL this client speaks: the SDK says what is wrong with it
        proxies = urllib.request.getproxies()
        if origin.scheme in proxies or "all" in proxies:
            return None
        if sdk.custom_auth is not None or any(isinstance(v, str) for v in sdk.default_query.values()):
            return None
        fields = {**sdk.default_headers, **sdk.auth_headers}
        headers: list[tuple[bytes, bytes]] = []
        for name, value in fields.items():
            if not isinstance(value, str):
                continue  # the SDK's Omit: a header it leaves out
            try:
                headers.append((name.encode("ascii"), value.encode("latin-1")))
            except UnicodeEncodeError:
                return None
        headers.append((b"Accept-Encoding", b"identity"))
        try:
            request_head("POST", target, origin, headers, b"")
        except ValueError:
            return None  # a header that could not go out as it is (the SDK reports it)
        return (origin, target), headers

    async def open(self, body: bytes) -> OpenAnswer:
        """Send the request; the answer once a 2xx status came, else the ``LLMError``."""
        if self._direct is None:
            return await self._open_through_sdk(body)
        url, headers = self._direct
        try:
            response = await self._http.request("POST", url, headers, body, self._timeouts)
        except HTTPTimeout:
            raise network_error(timed_out=True) from None
        except (HTTPError, ssl.SSLError, ValueError):
            raise network_error(timed_out=False) from None
        encoding = _header(response, b"content-encoding").lower()
        if 300 <= response.status < 400 or (200 <= response.status < 300 and encoding not in ("", "identity")):
            await response.aclose()
            log.info("llm.sent_through_sdk", status=response.status, content_encoding=encoding or None)
            self._direct = None
            return await self._open_through_sdk(body)
        if not 200 <= response.status < 300:
            raise await self._status_error(response)
        return OpenAnswer(_header(response, b"content-type"), aiter(response), response.aclose)

    async def _status_error(self, response: Response) -> LLMError:
        """The error status's ``LLMError``, its body read (as the SDK would) for the message."""
        try:
            text = (await response.read(MAX_ERROR_BODY)).decode("utf-8", "replace").strip()
        except (HTTPError, ssl.SSLError):
            text = ""
        finally:
            await response.aclose()
        body: object = text
        with contextlib.suppress(ValueError):
            body = json.loads(text)
        if isinstance(body, dict):
            body = body.get("error", body)
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in response.headers}
        return status_error(response.status, body, headers, self._secret)

    async def _open_through_sdk(self, body: bytes) -> OpenAnswer:
        try:
            response = await self._sdk.post(
                "/chat/completions", cast_to=httpx2.Response, content=body, stream=True, stream_cls=None
            )
        except openai.APIError as exc:
            raise sdk_error(exc, self._secret) from None
        return OpenAnswer(response.headers.get("content-type", ""), response.aiter_bytes(), response.aclose)


def _header(response: Response, name: bytes) -> str:
    for key, value in response.headers:
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return ""


async def _chunks(source: AsyncIterator[bytes], broken: BrokenStream) -> AsyncGenerator[bytes, None]:
    try:
        async for raw in source:
            yield raw
    except _NETWORK_ERRORS:
        raise broken() from None
