"""python-telegram-bot's HTTP layer on aiohttp instead of httpx.

``Bot`` builds every Bot API call (parameters, form encoding, the answer's objects and
error mapping) and hands the request to a :class:`telegram.request.BaseRequest`; only
that last step changes here. The wire format is the one ``HTTPXRequest`` sends: form
fields whose complex values are JSON, multipart when a file is uploaded. aiohttp is
already botd's HTTP stack, and its client costs about a third of httpx's CPU per call,
which was most of the channel's own time per message.

Failures map as in ``HTTPXRequest``: a timeout (including waiting for a free
connection) is ``TimedOut``, anything else on the way is ``NetworkError``. The bot
token is part of every URL, so error texts never carry the URL.
"""

from __future__ import annotations

import contextlib
import logging
from urllib.parse import urlencode

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from telegram._utils.defaultvalue import DefaultValue
from telegram.error import NetworkError, TimedOut
from telegram.request import BaseRequest, RequestData
from yarl import URL

from channels.telegram.redact import scrub

Timeout = float | None
# Named like python-telegram-bot's loggers; redact.TokenRedactor filters it (URLs hold the token).
request_log = logging.getLogger("telegram.AiohttpRequest")


class AiohttpRequest(BaseRequest):
    """A ``BaseRequest`` over one aiohttp session with its own connection pool."""

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
        self._session: aiohttp.ClientSession | None = None
        self._headers = {"User-Agent": self.USER_AGENT}
        self._form_headers = {**self._headers, "Content-Type": "application/x-www-form-urlencoded"}
        self._proxies: dict[str, tuple[URL | None, aiohttp.BasicAuth | None]] = {}

    @property
    def read_timeout(self) -> float | None:
        """The default read timeout (``Bot.get_updates`` adds the long-poll time to it)."""
        return self._read_timeout

    async def initialize(self) -> None:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._pool_size, limit_per_host=self._pool_size)
            # No trust_env: aiohttp would look up the proxy and .netrc in a thread on every
            # call; the proxy is looked up once per origin instead (see _proxy_for).
            self._session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
            self._proxies.clear()

    async def shutdown(self) -> None:
        session, self._session = self._session, None
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
        session = self._session
        if session is None or session.closed:
            raise RuntimeError("this AiohttpRequest is not initialized")
        files = request_data.multipart_data if request_data is not None else None
        fields = request_data.json_parameters if request_data is not None else None
        body: aiohttp.FormData | bytes | None = None
        headers = self._headers
        if files:
            body = aiohttp.FormData(fields or {})
            for name, (filename, content, mimetype) in files.items():
                body.add_field(name, content, filename=filename, content_type=mimetype)
        elif fields is not None:
            # The bytes aiohttp's FormData makes of a dict of strings, at half its cost per call.
            body, headers = urlencode(fields, doseq=True).encode(), self._form_headers
        timeout = self._timeout(
            _given(read_timeout, self._read_timeout),
            _given(write_timeout, self._media_write_timeout if files else self._write_timeout),
            _given(connect_timeout, self._connect_timeout),
            _given(pool_timeout, self._pool_timeout),
        )
        proxy, proxy_auth = self._proxy_for(url)
        try:
            async with session.request(method, url, data=body, headers=headers, timeout=timeout,
                                       allow_redirects=False, proxy=proxy, proxy_auth=proxy_auth) as response:
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

    @staticmethod
    def _timeout(read: Timeout, write: Timeout, connect: Timeout, pool: Timeout) -> aiohttp.ClientTimeout:
        """aiohttp's timeouts from httpx's four: ``connect`` covers the wait for a pooled
        connection plus connecting; ``sock_read`` bounds each wait for the answer; sending
        has no timeout of its own in aiohttp, so the sum of all four bounds the whole call."""
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
