"""python-telegram-bot's HTTP layer on botd's own client instead of httpx.

``Bot`` builds every Bot API call (parameters, form encoding, the answer's objects and
error mapping) and hands the request to a :class:`telegram.request.BaseRequest`; only
that last step changes here. The wire format is the one ``HTTPXRequest`` sends: form
fields whose complex values are JSON, multipart when a file is uploaded.

The calls of a message (``getUpdates``, ``sendChatAction``, ``sendMessage``, edits) go
over :class:`agent.http.HTTPClient`: keep-alive connections and nothing else, about half
the client CPU of a call over aiohttp, the library's share included (``bench/floor.py``).
Two kinds of call keep aiohttp, which does them already and is rare on the path of a
message: uploads (multipart bodies of up to 50 MB) and any call to an origin that
``HTTP(S)_PROXY`` / ``NO_PROXY`` send through a proxy (looked up once per origin, as httpx
did at start).

Failures map as in ``HTTPXRequest``: a timeout (including waiting for a free
connection) is ``TimedOut``, anything else on the way is ``NetworkError``. The bot
token is part of every URL, so error texts never carry the URL.
"""

from __future__ import annotations

import contextlib
import logging
from typing import IO
from urllib.parse import urlencode

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from telegram._utils.defaultvalue import DefaultValue
from telegram.error import NetworkError, TimedOut
from telegram.request import BaseRequest, RequestData
from yarl import URL

from agent.http import HTTPClient, HTTPError, HTTPTimeout, Timeouts
from channels.telegram.redact import scrub

Timeout = float | None
# Named like python-telegram-bot's loggers; redact.TokenRedactor filters it (URLs hold the token).
request_log = logging.getLogger("telegram.BotAPIRequest")
# A Bot API answer is JSON of at most a few hundred KiB (100 updates); past this it is not one.
MAX_ANSWER_BYTES = 32 << 20


class BotAPIRequest(BaseRequest):
    """A ``BaseRequest`` over one connection pool of its own (and an aiohttp session,
    opened when an upload or a proxied origin first needs it)."""

    def __init__(
        self,
        *,
        connection_pool_size: int = 32,
        read_timeout: Timeout = 5.0,
        write_timeout: Timeout = 5.0,
        connect_timeout: Timeout = 5.0,
        pool_timeout: Timeout = 1.0,
        media_write_timeout: Timeout = 20.0,
    ) -> None:
        self._pool_size = connection_pool_size
        self._read_timeout = read_timeout
        self._write_timeout = write_timeout
        self._connect_timeout = connect_timeout
        self._pool_timeout = pool_timeout
        self._media_write_timeout = media_write_timeout
        self._client: HTTPClient | None = None
        self._session: aiohttp.ClientSession | None = None
        agent = self.USER_AGENT.encode()
        self._headers = [(b"User-Agent", agent)]
        self._form_headers = [(b"User-Agent", agent), (b"Content-Type", b"application/x-www-form-urlencoded")]
        self._proxies: dict[str, tuple[URL | None, aiohttp.BasicAuth | None]] = {}

    @property
    def read_timeout(self) -> float | None:
        """The default read timeout (``Bot.get_updates`` adds the long-poll time to it)."""
        return self._read_timeout

    async def initialize(self) -> None:
        if self._client is None:
            self._client = HTTPClient(max_connections=self._pool_size, max_idle_per_origin=self._pool_size)
            self._proxies.clear()

    async def shutdown(self) -> None:
        client, self._client = self._client, None
        session, self._session = self._session, None
        if client is not None:
            await client.aclose()
        if session is not None and not session.closed:
            await session.close()

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: object = BaseRequest.DEFAULT_NONE,
        write_timeout: object = BaseRequest.DEFAULT_NONE,
        connect_timeout: object = BaseRequest.DEFAULT_NONE,
        pool_timeout: object = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        client = self._client
        if client is None:
            raise RuntimeError("this BotAPIRequest is not initialized")
        files = request_data.multipart_data if request_data is not None else None
        fields = request_data.json_parameters if request_data is not None else None
        timeouts = Timeouts(
            read=_given(read_timeout, self._read_timeout),
            write=_given(write_timeout, self._media_write_timeout if files else self._write_timeout),
            connect=_given(connect_timeout, self._connect_timeout),
            pool=_given(pool_timeout, self._pool_timeout),
        )
        proxy = self._proxy_for(url)
        if files or proxy[0] is not None:
            return await self._via_aiohttp(url, method, fields, files, timeouts, proxy)
        body, headers = b"", self._headers
        if fields is not None:
            body, headers = urlencode(fields, doseq=True).encode(), self._form_headers
        try:
            response = await client.request(method, url, headers, body, timeouts)
            payload = await response.read(MAX_ANSWER_BYTES)
        except HTTPTimeout as exc:
            raise TimedOut(f"{type(exc).__name__}: {_clean(exc, url)}") from exc
        except (HTTPError, ValueError) as exc:
            raise NetworkError(f"{type(exc).__name__}: {_clean(exc, url)}") from exc
        if request_log.isEnabledFor(logging.DEBUG):
            request_log.debug('HTTP Request: %s %s "%s %s"', method, url, response.status, response.reason.decode())
        return response.status, payload

    async def _via_aiohttp(
        self,
        url: str,
        method: str,
        fields: dict[str, str] | None,
        files: dict[str, tuple[str, bytes | IO[bytes], str]] | None,
        timeouts: Timeouts,
        proxy: tuple[URL | None, aiohttp.BasicAuth | None],
    ) -> tuple[int, bytes]:
        """An upload, or a call through a proxy: aiohttp's request with the same fields."""
        session = self._session
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(limit=self._pool_size, limit_per_host=self._pool_size)
            # No trust_env: aiohttp would look up the proxy and .netrc in a thread on every
            # call; the proxy is looked up once per origin instead (see _proxy_for).
            session = self._session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
        body: aiohttp.FormData | bytes | None = None
        headers = {"User-Agent": self.USER_AGENT}
        if files:
            body = aiohttp.FormData(fields or {})
            for name, (filename, content, mimetype) in files.items():
                body.add_field(name, content, filename=filename, content_type=mimetype)
        elif fields is not None:
            body = urlencode(fields, doseq=True).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            async with session.request(method, url, data=body, headers=headers, timeout=_aiohttp_timeout(timeouts),
                                       allow_redirects=False, proxy=proxy[0], proxy_auth=proxy[1]) as response:
                payload = await response.read()
        except TimeoutError as exc:
            raise TimedOut(f"aiohttp.{type(exc).__name__}: {_clean(exc, url)}") from exc
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise NetworkError(f"aiohttp.{type(exc).__name__}: {_clean(exc, url)}") from exc
        if request_log.isEnabledFor(logging.DEBUG):
            request_log.debug('HTTP Request: %s %s "%s %s"', method, url, response.status, response.reason)
        return response.status, payload

    def _proxy_for(self, url: str) -> tuple[URL | None, aiohttp.BasicAuth | None]:
        """The proxy from HTTP(S)_PROXY / NO_PROXY for the URL's origin, as httpx honoured
        them, read once per origin and session."""
        origin = url[: url.find("/", url.find("//") + 2)]
        found = self._proxies.get(origin)
        if found is None:
            found = (None, None)
            with contextlib.suppress(LookupError, ValueError):
                found = get_env_proxy_for_url(URL(origin))
            self._proxies[origin] = found
        return found


def _aiohttp_timeout(timeouts: Timeouts) -> aiohttp.ClientTimeout:
    """aiohttp's timeouts from httpx's four: ``connect`` covers the wait for a pooled
    connection plus connecting; ``sock_read`` bounds each wait for the answer; sending
    has no timeout of its own in aiohttp, so the sum of all four bounds the whole call."""
    read, write, connect, pool = timeouts.read, timeouts.write, timeouts.connect, timeouts.pool
    parts = (read, write, connect, pool)
    total = None if any(p is None for p in parts) else sum(p for p in parts if p is not None)
    acquire = None if connect is None or pool is None else connect + pool
    return aiohttp.ClientTimeout(total=total, connect=acquire, sock_connect=connect, sock_read=read)


def _given(value: object, default: Timeout) -> Timeout:
    """A per-call timeout, or the default when the caller left it at ``DEFAULT_NONE``."""
    if isinstance(value, DefaultValue):
        return default
    return None if value is None else float(value)  # type: ignore[arg-type]


def _clean(exc: BaseException, url: str) -> str:
    """The error's text without the URL (it holds the bot token)."""
    return scrub((str(exc) or type(exc).__name__).replace(url, "<bot api url>"))
