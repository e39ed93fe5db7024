"""One HTTP/1.1 connection: the request's head as bytes, and the protocol that parses
the answer (llhttp, through ``httptools``) as it arrives, with the errors, timeouts and
origins the client speaks of. The pool and the caller's side are ``client.py``'s.
"""

from __future__ import annotations

import asyncio
import collections
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

import httptools

if TYPE_CHECKING:
    from agent.http.client import HTTPClient

MAX_BUFFERED = 1 << 20  # bytes of an answer held before reading from the socket pauses
MAX_HEADER_BYTES = 64 << 10  # an answer's status line and headers, together
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a header's name (RFC 9110 token)
_UNSAFE_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # no CR, LF or other control in a value
_UNSAFE_TARGET = re.compile(rb"[\x00-\x20\x7f]")  # no space or control in a request target


class HTTPError(Exception):
    """A request that did not get a whole answer."""


class ConnectError(HTTPError):
    """No connection to the origin (refused, unreachable, TLS handshake failed)."""


class RemoteProtocolError(HTTPError):
    """The server's answer is not HTTP/1.1 as it should be, too large, or was cut off."""


class HTTPTimeout(HTTPError):
    """A phase of the request took longer than its timeout."""


class PoolTimeout(HTTPTimeout):
    pass


class ConnectTimeout(HTTPTimeout):
    pass


class WriteTimeout(HTTPTimeout):
    pass


class ReadTimeout(HTTPTimeout):
    pass


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds for each phase; None waits as long as it takes."""

    connect: float | None = 10.0
    read: float | None = 30.0
    write: float | None = 30.0
    pool: float | None = 10.0


@dataclass(frozen=True, slots=True)
class Origin:
    """Where connections go: scheme, host (ASCII: punycode for a name, no brackets for an
    IPv6 address) and port; ``host_header`` is what the requests' ``Host`` says."""

    scheme: str
    host: str
    port: int
    host_header: bytes

    @classmethod
    def of(cls, scheme: str, host: str, port: int | None) -> Origin:
        default = 443 if scheme == "https" else 80
        shown = f"[{host}]" if ":" in host else host
        port = port or default
        header = (shown if port == default else f"{shown}:{port}").encode("ascii")
        return cls(scheme, host, port, header)


@lru_cache(maxsize=256)
def split_url(url: str) -> tuple[Origin, bytes]:
    """(origin, request target) of an absolute http(s) URL; ValueError for anything else."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("only absolute http:// and https:// URLs are supported")
    if parts.username is not None or parts.password is not None:
        raise ValueError("credentials in the URL are not supported")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    raw = target.encode("ascii", "strict")  # callers percent-encode; anything else is a bug
    if _UNSAFE_TARGET.search(raw):
        raise ValueError("the URL's path holds a space or a control character")
    host = parts.hostname.encode("idna").decode("ascii") if not parts.hostname.isascii() else parts.hostname
    return Origin.of(scheme, host, parts.port), raw


class Connection(asyncio.Protocol):
    """One socket: the request written, the answer parsed as it arrives."""

    def __init__(self, client: HTTPClient, origin: Origin) -> None:
        self.client = client
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[None] | None = None
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.reading_paused = False
        self.writing_paused = False
        self.lost = False
        self.error: HTTPError | None = None
        self.idle_since = 0.0
        self.reset()

    def reset(self) -> None:
        """Forget the last answer: the connection is taken for a new request."""
        self.idle = False
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.header_bytes = 0
        self.headers_done = False
        self.complete = False
        self.until_close = False
        self.keep_alive = False
        self.informational = False
        self.received = False

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one without subclassing it

    def data_received(self, data: bytes) -> None:
        if self.idle:  # nothing was asked: the parser's state is no longer ours to trust
            self._fail(RemoteProtocolError("the server sent data on an idle connection"))
            return
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(RemoteProtocolError("the server switched protocols"))
        except httptools.HttpParserError as exc:
            ours = exc.__context__  # a callback below refused what it was handed
            self._fail(ours if isinstance(ours, RemoteProtocolError)
                       else RemoteProtocolError(f"the answer is not valid HTTP/1.1 ({exc})"))
        if self.buffered > MAX_BUFFERED and not self.reading_paused and self.transport is not None:
            self.transport.pause_reading()
            self.reading_paused = True
        self._wake()

    def eof_received(self) -> bool:
        return False  # close our side too: an HTTP/1.1 answer never half-closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.headers_done and self.until_close and not self.complete:
            self.complete = True  # a body without a length ends where the connection does
        self._wake()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake()

    # -- parser callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:  # bytes after the whole answer, in the same packet: not ours to read
            raise RemoteProtocolError("the server sent more than it was asked for")

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value) + 4
        if self.header_bytes > MAX_HEADER_BYTES:
            raise RemoteProtocolError(f"the answer's headers are over {MAX_HEADER_BYTES} bytes")
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue, 103 Early Hints): the real one follows
            self.informational = True
            self.headers, self.header_bytes, self.reason = [], 0, b""
            return
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()
        framed = status in (204, 304) or any(
            name.lower() in (b"content-length", b"transfer-encoding") for name, _ in self.headers
        )
        self.until_close = not framed
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            return
        self.complete = True

    # -- the caller's side ---------------------------------------------------------------

    def _fail(self, error: HTTPError) -> None:
        self.error = error
        if self.transport is not None:
            self.transport.abort()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout: float | None, expired: type[HTTPTimeout], what: str) -> None:
        """Until the protocol has news (data, the end, a failure, room to write)."""
        loop = asyncio.get_running_loop()
        waiter = self.waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        except TimeoutError:
            raise expired(f"no {what} within {timeout:g} s") from None
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()

    def check(self) -> None:
        """Raise what ended this connection before its answer did."""
        if self.error is not None:
            raise self.error
        if self.lost and not self.complete:
            where = "while sending its answer" if self.received else "before answering"
            raise RemoteProtocolError(f"the server closed the connection {where}")

    def take(self) -> bytes | None:
        """The next buffered piece of the body, or None when nothing is buffered."""
        if not self.chunks:
            return None
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self.reading_paused and self.buffered <= MAX_BUFFERED // 2 and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()
        return chunk

    def settle(self) -> bool:
        """Ready for the next request (the answer whole, the server keeping the connection
        open); what the caller left unread of the body is dropped."""
        if not (self.complete and self.keep_alive) or self.lost or self.error is not None:
            return False
        self.chunks.clear()
        self.buffered = 0
        if self.reading_paused and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()
        return True


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def request_head(method: str, target: bytes, origin: Origin, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> bytes:
    """The request line and headers; ValueError for a header that could end its line or
    start another, and for HEAD (its answer's length would be read as a body to wait for)."""
    if method == "HEAD" or not _TOKEN.fullmatch(method.encode("ascii", "replace")):
        raise ValueError(f"method {method!r} is not supported")
    if _UNSAFE_TARGET.search(target):
        raise ValueError("the URL's path holds a space or a control character")
    lines = [b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (method.encode("ascii"), target, origin.host_header)]
    for name, value in headers:
        if not _TOKEN.fullmatch(name) or _UNSAFE_VALUE.search(value):
            raise ValueError("a request header's name is not a token, or its value holds a control character")
        lines.append(b"%s: %s\r\n" % (name, value))
    if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        lines.append(b"Content-Length: %d\r\n" % len(body))
    lines.append(b"\r\n")
    return b"".join(lines)
