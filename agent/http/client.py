"""The HTTP/1.1 client under a message's calls: keep-alive connections on asyncio,
answers parsed by llhttp (``httptools``), and its face as an httpx2 transport.

A message makes a few small requests to a couple of origins: the Bot API's form calls
(through python-telegram-bot) and one streamed model request (through the ``openai``
SDK). Both libraries hand the HTTP step to a pluggable transport, and aiohttp, which
botd used there, spent most of a call's client CPU on what these calls never use (URL
objects, header multidicts, a writer task per request, cookie and trace hooks, a timer
per chunk): a ``sendChatAction``, library included, cost 0.29-0.33 ms of CPU through it
and 0.15-0.17 ms here (``bench/floor.py``). This client does what those calls need and
nothing else:

* ``http`` and ``https`` origins (TLS with the given context, SNI by host name);
* a request of bytes, written in one go; the answer read whole or streamed, with
  reading paused while more than :data:`MAX_BUFFERED` bytes wait for the caller;
* keep-alive per origin, at most ``max_connections`` open in all, idle ones closed after
  ``keepalive_s`` or when the server says so; a connection whose answer was not read to
  its end, or whose caller was cancelled, is closed, never reused;
* the four timeouts httpx and python-telegram-bot speak of: ``pool`` (waiting for a
  connection), ``connect``, ``write`` (the request leaving the buffer), ``read`` (each wait
  for the answer's next bytes).

No proxies, redirects, cookies, compression or streamed uploads: callers that need one
use their library's own stack for that request (``channels.telegram.transport``), or
get it from httpx2 around this transport (its proxy mounts, its redirects and decoding).

Every failure is an :class:`HTTPError`: :class:`ConnectError` (nothing reached the
server), :class:`HTTPTimeout` (``PoolTimeout``, ``ConnectTimeout``, ``WriteTimeout``,
``ReadTimeout``), :class:`RemoteProtocolError` (an answer that is not HTTP, too large,
or cut by the server). Nothing is retried here: whether a request may be sent again is
the caller's to decide.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterable
from functools import lru_cache
from typing import Any

import httpx2

from agent.http.connection import (
    ConnectError,
    Connection,
    ConnectTimeout,
    HTTPError,
    Origin,
    PoolTimeout,
    ReadTimeout,
    RemoteProtocolError,
    Timeouts,
    WriteTimeout,
    request_head,
    split_url,
)


class Response:
    """An answer whose status and headers arrived; the body is read with :meth:`read` or
    by iterating, and the connection goes back to the pool once it is read to its end.
    Close it (``aclose``) when the body is left unread."""

    def __init__(self, connection: Connection, read_timeout: float | None) -> None:
        self._connection: Connection | None = connection
        self._read_timeout = read_timeout
        self.status = connection.status
        self.reason = connection.reason
        self.headers = connection.headers

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._connection
        if conn is None:
            return
        try:
            while True:
                chunk = conn.take()
                if chunk is not None:
                    yield chunk
                    continue
                if conn.complete:
                    break
                conn.check()
                await conn.wait(self._read_timeout, ReadTimeout, "answer bytes")
        except BaseException:
            self._release(reuse=False)
            raise
        self._release(reuse=True)

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body; :class:`RemoteProtocolError` past ``limit`` bytes."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self:
            size += len(chunk)
            if limit is not None and size > limit:
                await self.aclose()
                raise RemoteProtocolError(f"the answer is over {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    async def aclose(self) -> None:
        """Let go of the connection: back to the pool if the whole answer has arrived,
        closed otherwise (the server may still be sending; the socket is not reusable)."""
        self._release(reuse=True)

    def _release(self, *, reuse: bool) -> None:
        conn, self._connection = self._connection, None
        if conn is not None:
            conn.client._release(conn, reuse=reuse)


class HTTPClient:
    """Keep-alive HTTP/1.1 connections to any number of origins, ``max_connections`` in all."""

    def __init__(
        self,
        *,
        max_connections: int = 100,
        max_idle_per_origin: int = 20,
        keepalive_s: float = 15.0,
        ssl_context: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        """``ssl_context`` (or a function making it, called at the first https connection):
        the TLS settings for https origins; None: the system's trust store."""
        if max_connections < 1 or max_idle_per_origin < 0 or keepalive_s < 0:
            raise ValueError("max_connections must be >= 1, max_idle_per_origin and keepalive_s >= 0")
        self.max_connections = max_connections
        self.max_idle_per_origin = max_idle_per_origin
        self.keepalive_s = keepalive_s
        self._ssl = ssl_context
        self._idle: dict[Origin, list[Connection]] = {}
        self._open = 0  # connections open or being opened
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    @property
    def open_connections(self) -> int:
        return self._open

    async def request(
        self,
        method: str,
        url: str | tuple[Origin, bytes],
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes = b"",
        timeouts: Timeouts = Timeouts(),
    ) -> Response:
        """Send one request; the answer once its status and headers arrived."""
        origin, target = split_url(url) if isinstance(url, str) else url
        head = request_head(method, target, origin, headers, body)
        conn = await self._acquire(origin, timeouts)
        try:
            transport = conn.transport
            assert transport is not None
            if len(body) <= 16384:
                transport.write(head + body)
            else:
                transport.write(head)
                transport.write(body)
            while conn.writing_paused and not conn.lost:
                await conn.wait(timeouts.write, WriteTimeout, "room to send the request")
            while not conn.headers_done:
                conn.check()
                await conn.wait(timeouts.read, ReadTimeout, "answer")
        except BaseException:
            self._release(conn, reuse=False)
            raise
        return Response(conn, timeouts.read)

    async def aclose(self) -> None:
        """Close the idle connections; those in use close when their answers are done."""
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                self._close(conn)
        self._idle.clear()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- the pool ------------------------------------------------------------------------

    async def _acquire(self, origin: Origin, timeouts: Timeouts) -> Connection:
        deadline = None if timeouts.pool is None else time.monotonic() + timeouts.pool
        while True:
            if self._closed:
                raise ConnectError("the HTTP client is closed")
            conn = self._idle_connection(origin)
            if conn is not None:
                conn.reset()
                return conn
            if self._open < self.max_connections or self._close_an_idle_one():
                return await self._connect(origin, timeouts.connect)
            await self._wait_for_room(deadline, timeouts.pool)

    def _idle_connection(self, origin: Origin) -> Connection | None:
        conns = self._idle.get(origin)
        now = time.monotonic()
        while conns:
            conn = conns.pop()
            if conn.lost or conn.error is not None or now - conn.idle_since > self.keepalive_s:
                self._close(conn)
                continue
            return conn
        return None

    def _close_an_idle_one(self) -> bool:
        """Make room for a new origin by closing the longest-idle connection of any."""
        oldest = min((c for conns in self._idle.values() for c in conns), key=lambda c: c.idle_since, default=None)
        if oldest is None:
            return False
        self._idle[oldest.origin].remove(oldest)
        self._close(oldest)
        return True

    async def _wait_for_room(self, deadline: float | None, pool_timeout: float | None) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            if deadline is None:
                await waiter
            else:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await waiter
        except TimeoutError:
            raise PoolTimeout(f"no free connection within {pool_timeout:g} s "
                              f"({self.max_connections} in use)") from None
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif waiter.done() and not waiter.cancelled() and self._open < self.max_connections:
                self._wake_one()  # handed a slot it will not use: pass it on

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _connect(self, origin: Origin, timeout: float | None) -> Connection:
        self._open += 1
        loop = asyncio.get_running_loop()
        tls = origin.scheme == "https"
        context = self._tls_context() if tls else None
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: Connection(self, origin), origin.host, origin.port,
                    ssl=context, server_hostname=origin.host if tls else None,
                )
        except TimeoutError:
            self._gone()
            raise ConnectTimeout(f"no connection to {origin.host}:{origin.port} within {timeout:g} s") from None
        except (OSError, ssl.SSLError, ssl.CertificateError) as exc:
            self._gone()
            raise ConnectError(f"cannot connect to {origin.host}:{origin.port}: {exc}") from exc
        except BaseException:
            self._gone()
            raise
        return conn

    def _tls_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = _default_context()
        elif not isinstance(self._ssl, ssl.SSLContext):
            self._ssl = self._ssl()
        return self._ssl

    def _release(self, conn: Connection, *, reuse: bool) -> None:
        if reuse and not self._closed and conn.settle():
            conns = self._idle.setdefault(conn.origin, [])
            if len(conns) < self.max_idle_per_origin:
                conn.idle = True
                conn.idle_since = time.monotonic()
                conns.append(conn)
                self._wake_one()
                return
        self._close(conn)

    def _close(self, conn: Connection) -> None:
        if conn.transport is not None and not conn.transport.is_closing():
            conn.transport.abort()
        self._gone()

    def _gone(self) -> None:
        self._open -= 1
        self._wake_one()


@lru_cache(maxsize=1)
def _default_context() -> ssl.SSLContext:
    return ssl.create_default_context()


# -- as an httpx2 transport ------------------------------------------------------------------

_HOP_BY_HOP = frozenset({b"host", b"content-length", b"transfer-encoding", b"connection", b"keep-alive"})


class HTTPXClient(httpx2.AsyncClient):
    """An ``httpx2.AsyncClient`` whose requests go over :class:`HTTPClient`, but for those
    httpx2 sends through a proxy from ``HTTP(S)_PROXY`` / ``NO_PROXY`` (its own transport
    does those, as without this client). httpx2 reads the environment's proxies only for
    the transport it makes itself, so this one is made there too, as the ``openai`` SDK's
    aiohttp client does."""

    def __init__(self, http: HTTPClient, **kwargs: Any) -> None:
        self.http = http
        super().__init__(**kwargs)

    def _init_transport(self, *args: Any, transport: httpx2.AsyncBaseTransport | None = None,
                        **kwargs: Any) -> httpx2.AsyncBaseTransport:
        return transport if transport is not None else HTTPXTransport(self.http)


class HTTPXTransport(httpx2.AsyncBaseTransport):
    """:class:`HTTPClient` under an ``httpx2.AsyncClient`` (the ``openai`` SDK's): httpx2
    keeps its part (headers, redirects, decoding, proxies from the environment through
    its own mounts), this sends the request. Failures become httpx2's exceptions, which
    the SDK maps to its own."""

    def __init__(self, client: HTTPClient) -> None:
        self.client = client

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        spec: dict[str, Any] = request.extensions.get("timeout") or {}
        timeouts = Timeouts(connect=spec.get("connect"), read=spec.get("read"), write=spec.get("write"),
                            pool=spec.get("pool"))
        try:
            body = request.content
        except httpx2.RequestNotRead:  # a streamed body, or one httpx2 rebuilt to follow a redirect
            body = await request.aread()
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in _HOP_BY_HOP]
        url = request.url
        origin = Origin.of(url.scheme, url.raw_host.decode("ascii"), url.port)
        try:
            response = await self.client.request(request.method, (origin, url.raw_path), headers, body, timeouts)
        except ValueError as exc:
            raise httpx2.UnsupportedProtocol(str(exc), request=request) from exc
        except HTTPError as exc:
            raise _httpx_error(exc, request) from exc
        return httpx2.Response(
            response.status, headers=response.headers, stream=_HTTPXStream(response, request), request=request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": response.reason},
        )

    async def aclose(self) -> None:
        await self.client.aclose()


class _HTTPXStream(httpx2.AsyncByteStream):
    def __init__(self, response: Response, request: httpx2.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response:
                yield chunk
        except HTTPError as exc:
            raise _httpx_error(exc, self._request) from exc

    async def aclose(self) -> None:
        await self._response.aclose()


_HTTPX_ERRORS: tuple[tuple[type[HTTPError], type[httpx2.RequestError]], ...] = (
    (PoolTimeout, httpx2.PoolTimeout),
    (ConnectTimeout, httpx2.ConnectTimeout),
    (WriteTimeout, httpx2.WriteTimeout),
    (ReadTimeout, httpx2.ReadTimeout),
    (ConnectError, httpx2.ConnectError),
    (RemoteProtocolError, httpx2.RemoteProtocolError),
)


def _httpx_error(exc: HTTPError, request: httpx2.Request) -> httpx2.RequestError:
    for ours, theirs in _HTTPX_ERRORS:
        if isinstance(exc, ours):
            return theirs(str(exc), request=request)
    return httpx2.TransportError(str(exc), request=request)
