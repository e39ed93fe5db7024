"""botd's HTTP/1.1 client against a raw server on 127.0.0.1 that writes exactly the bytes
each test gives it: framing (length, chunks, close), keep-alive and when a connection
must not be reused, every failure as its error, the pool's bound, cancellation, TLS, and
the client as the openai SDK's httpx2 transport."""

from __future__ import annotations

import asyncio
import gzip
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx2
import pytest
import trustme
import uvloop

from agent.http import (
    MAX_BUFFERED,
    ConnectError,
    ConnectTimeout,
    HTTPClient,
    HTTPXClient,
    HTTPXTransport,
    PoolTimeout,
    ReadTimeout,
    RemoteProtocolError,
    Timeouts,
    split_url,
)

pytestmark = pytest.mark.timeout(30)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[None]]


@dataclass
class Server:
    """Each connection runs ``handler``; what came in is kept per connection."""

    handler: Handler
    port: int = 0
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    closed_by_client: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went, or the test is over
        finally:
            writer.close()

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        """Read one request (head and a Content-Length body); b"" when the client closed."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            self.closed_by_client.set()
            return b""
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        return head + body


@asynccontextmanager
async def serving(handler: Handler, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    server = Server(handler)
    listener = await asyncio.start_server(server._serve, "127.0.0.1", 0, ssl=ssl_context)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listener.close()


def answering(*answers: bytes) -> Handler:
    """A keep-alive handler that answers each request with the next of ``answers`` (the last repeats)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        count = 0
        while await server.request(reader):
            writer.write(answers[min(count, len(answers) - 1)])
            await writer.drain()
            count += 1

    return handle


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello"


@pytest.fixture
async def client() -> AsyncIterator[HTTPClient]:
    http = HTTPClient(max_connections=4)
    try:
        yield http
    finally:
        await http.aclose()


async def get(client: HTTPClient, url: str, **timeouts: float) -> tuple[int, bytes]:
    response = await client.request("GET", url, [(b"Accept", b"*/*")], timeouts=Timeouts(**timeouts))
    return response.status, await response.read()


# -- framing and keep-alive ------------------------------------------------------------


async def test_a_request_goes_out_as_written_and_the_connection_is_kept(client: HTTPClient) -> None:
    async with serving(answering(OK)) as server:
        response = await client.request("POST", server.url + "/bot1/sendMessage?x=1",
                                        [(b"Content-Type", b"application/x-www-form-urlencoded")], b"a=1&b=%20")
        assert (response.status, response.reason, await response.read()) == (200, b"OK", b"hello")
        assert (b"Content-Type", b"text/plain") in response.headers
        assert await get(client, server.url + "/again") == (200, b"hello")
    first, second = server.requests
    assert first == (f"POST /bot1/sendMessage?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                     "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 9\r\n\r\na=1&b=%20").encode()
    assert second.startswith(b"GET /again HTTP/1.1\r\n") and b"Content-Length" not in second
    assert server.connections == 1 and client.open_connections == 1


async def test_a_chunked_answer_streams_as_it_comes_and_the_connection_is_reused(client: HTTPClient) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        while await server.request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
            await writer.drain()

    async with serving(handle) as server:
        response = await client.request("GET", server.url + "/", [])
        pieces = [chunk async for chunk in response]
        assert pieces == [b"first", b"second"]
        assert await get(client, server.url + "/") == (200, b"firstsecond")
    assert server.connections == 1


async def test_an_answer_without_a_length_ends_with_the_connection(client: HTTPClient) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
        await writer.drain()

    async with serving(handle) as server:
        assert await get(client, server.url + "/") == (200, b"until the end")
        assert await get(client, server.url + "/") == (200, b"until the end")
    assert server.connections == 2 and client.open_connections == 0


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
])
async def test_a_connection_the_server_closes_is_not_reused(client: HTTPClient, answer: bytes) -> None:
    async with serving(answering(answer)) as server:
        assert await get(client, server.url + "/") == (200, b"ok")
        assert await get(client, server.url + "/") == (200, b"ok")
    assert server.connections == 2


async def test_bodiless_and_interim_answers(client: HTTPClient) -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"
    async with serving(answering(b"HTTP/1.1 204 No Content\r\n\r\n", interim)) as server:
        assert await get(client, server.url + "/") == (204, b"")
        assert await get(client, server.url + "/") == (201, b"ok")
    assert server.connections == 1


async def test_a_keep_alive_connection_the_server_dropped_is_replaced(client: HTTPClient) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        writer.write(OK)
        await writer.drain()  # then closes, though the answer said keep-alive

    async with serving(handle) as server:
        assert await get(client, server.url + "/") == (200, b"hello")
        await asyncio.sleep(0.05)
        assert await get(client, server.url + "/") == (200, b"hello")
    assert server.connections == 2


async def test_idle_connections_expire(client: HTTPClient) -> None:
    client.keepalive_s = 0.05
    async with serving(answering(OK)) as server:
        await get(client, server.url + "/")
        await asyncio.sleep(0.1)
        await get(client, server.url + "/")
    assert server.connections == 2


async def test_bytes_on_an_idle_connection_retire_it(client: HTTPClient) -> None:
    async with serving(answering(OK + b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbad")) as server:
        assert await get(client, server.url + "/") == (200, b"hello")
        await asyncio.sleep(0.05)
        assert await get(client, server.url + "/") == (200, b"hello")  # not the stray "bad"
    assert server.connections == 2


async def test_a_large_body_arrives_whole_with_reading_paused_between(client: HTTPClient) -> None:
    body = bytes(range(256)) * (12 * MAX_BUFFERED // 256)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    async with serving(answering(answer)) as server:
        response = await client.request("GET", server.url + "/", [])
        got = bytearray()
        async for chunk in response:
            got += chunk
            await asyncio.sleep(0)
        assert bytes(got) == body
        assert await get(client, server.url + "/") == (200, body)
    assert server.connections == 1


# -- failures ------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "match"), [
    (b"NOT HTTP AT ALL\r\n\r\n", "not valid HTTP"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "while sending its answer"),
    (b"", "before answering"),
    (b"HTTP/1.1 200 OK\r\nX-Big: " + b"x" * 70_000 + b"\r\n\r\n", "headers are over"),
    (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n", "switched"),
])
async def test_a_broken_answer_is_a_protocol_error(client: HTTPClient, answer: bytes, match: str) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        writer.write(answer)
        await writer.drain()

    async with serving(handle) as server:
        with pytest.raises(RemoteProtocolError, match=match):
            await get(client, server.url + "/")
    assert client.open_connections == 0


async def test_a_silent_server_is_a_read_timeout_and_the_connection_is_closed(client: HTTPClient) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        await server.request(reader)  # returns once the client closes

    async with serving(handle) as server:
        with pytest.raises(ReadTimeout):
            await get(client, server.url + "/", read=0.1)
        await asyncio.wait_for(server.closed_by_client.wait(), 5)
    assert client.open_connections == 0


async def test_nothing_listening_is_a_connect_error(client: HTTPClient) -> None:
    with pytest.raises(ConnectError, match="127.0.0.1:9") as caught:
        await get(client, "http://127.0.0.1:9/")
    assert isinstance(caught.value.__cause__, OSError)
    assert client.open_connections == 0


async def test_a_handshake_that_never_ends_is_a_connect_timeout(client: HTTPClient) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await reader.read()  # accepts, says nothing: the TLS handshake waits forever

    async with serving(handle) as server:
        with pytest.raises(ConnectTimeout):
            await get(client, f"https://127.0.0.1:{server.port}/", connect=0.2)
    assert client.open_connections == 0


async def test_requests_beyond_the_bound_wait_for_a_connection() -> None:
    gate = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        while await server.request(reader):
            await gate.wait()
            writer.write(OK)
            await writer.drain()

    http = HTTPClient(max_connections=1)
    try:
        async with serving(handle) as server:
            first = asyncio.create_task(get(http, server.url + "/"))
            await asyncio.sleep(0.05)
            with pytest.raises(PoolTimeout):
                await get(http, server.url + "/", pool=0.1)
            second = asyncio.create_task(get(http, server.url + "/", pool=5))
            await asyncio.sleep(0.05)
            gate.set()
            assert await first == await second == (200, b"hello")
        assert server.connections == 1
    finally:
        await http.aclose()


async def test_a_new_origin_takes_the_place_of_an_idle_connection() -> None:
    http = HTTPClient(max_connections=1)
    try:
        async with serving(answering(OK)) as one, serving(answering(OK)) as two:
            assert await get(http, one.url + "/", pool=0.5) == (200, b"hello")
            assert await get(http, two.url + "/", pool=0.5) == (200, b"hello")
            assert http.open_connections == 1
    finally:
        await http.aclose()


async def test_a_cancelled_request_closes_its_connection(client: HTTPClient) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\none\r\n")
        await writer.drain()
        await server.request(reader)  # until the client goes

    async with serving(handle) as server:
        response = await client.request("GET", server.url + "/", [])

        async def consume() -> None:
            async for _ in response:
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.closed_by_client.wait(), 5)
    assert client.open_connections == 0


async def test_an_answer_left_unread_is_not_reused_unless_it_is_whole(client: HTTPClient) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        while await server.request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf.")
            await writer.drain()

    async with serving(handle) as server:
        response = await client.request("GET", server.url + "/", [])
        await response.aclose()
        assert client.open_connections == 0
    async with serving(answering(OK)) as server:
        response = await client.request("GET", server.url + "/", [])
        await asyncio.sleep(0.05)  # the whole answer is in
        await response.aclose()
        assert await get(client, server.url + "/") == (200, b"hello")
    assert server.connections == 1


async def test_an_answer_over_the_limit_is_refused(client: HTTPClient) -> None:
    async with serving(answering(OK)) as server:
        response = await client.request("GET", server.url + "/", [])
        with pytest.raises(RemoteProtocolError, match="over 3 bytes"):
            await response.read(limit=3)


@pytest.mark.parametrize("header", [
    (b"X-Evil", b"a\r\nInjected: 1"), (b"X-Evil", b"a\nb"), (b"X-Ev\r\nil", b"a"), (b"Bad:Name", b"a"),
    (b"", b"a"), (b"Two Words", b"a"), (b"X-Nul", b"a\x00b"),
])
async def test_a_header_cannot_smuggle_a_line(client: HTTPClient, header: tuple[bytes, bytes]) -> None:
    async with serving(answering(OK)) as server:
        with pytest.raises(ValueError, match="not a token|control character"):
            await client.request("GET", server.url + "/", [header])
        with pytest.raises(ValueError, match="not supported"):
            await client.request("HEAD", server.url + "/", [])
        with pytest.raises(ValueError, match="not supported"):
            await client.request("GET /x HTTP/1.1\r\nX:", server.url + "/", [])
    assert server.requests == [] and client.open_connections == 0


@pytest.mark.parametrize("url", [
    "ftp://127.0.0.1/", "http:///nohost", "http://user:pw@127.0.0.1/", "http://127.0.0.1/a b", "http://127.0.0.1/é",
])
def test_only_plain_http_urls_are_taken(url: str) -> None:
    with pytest.raises(ValueError):
        split_url(url)


def test_the_host_header_names_the_port_only_when_it_is_not_the_default() -> None:
    assert split_url("https://api.example.com/v1?x=1")[0].host_header == b"api.example.com"
    assert split_url("http://[::1]:8080/")[0].host_header == b"[::1]:8080"
    origin, target = split_url("https://bücher.example:8443/a%20b")
    assert (origin.host, origin.host_header, target) == ("xn--bcher-kva.example", b"xn--bcher-kva.example:8443",
                                                          b"/a%20b")


# -- TLS -----------------------------------------------------------------------------


async def test_tls_with_a_trusted_certificate_and_not_without() -> None:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    trusting = HTTPClient(ssl_context=lambda: client_context)
    default = HTTPClient()
    try:
        async with serving(answering(OK), server_context) as server:
            url = f"https://localhost:{server.port}/secure"
            assert await get(trusting, url) == (200, b"hello")
            assert server.requests[0].startswith(b"GET /secure HTTP/1.1\r\nHost: localhost:")
            with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await get(default, url)
    finally:
        await trusting.aclose()
        await default.aclose()


# -- as the SDK's httpx2 transport -----------------------------------------------------------


async def test_httpx2_over_the_client_decodes_and_reports_as_httpx2() -> None:
    packed = gzip.compress(b'{"ok": true}')
    answer = (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(packed) + packed)
    http = HTTPClient()
    async with httpx2.AsyncClient(transport=HTTPXTransport(http)) as client:
        async with serving(answering(answer)) as server:
            response = await client.post(server.url + "/v1/chat", content=b'{"q": 1}',
                                         headers={"Authorization": "Bearer k"})
            assert response.status_code == 200 and response.json() == {"ok": True}
            request = server.requests[0]
            assert request.startswith(b"POST /v1/chat HTTP/1.1\r\nHost: 127.0.0.1:")
            assert b"\r\nAuthorization: Bearer k\r\n" in request and request.endswith(b'\r\n\r\n{"q": 1}')
            assert request.count(b"Host:") == 1 and request.lower().count(b"content-length") == 1
        with pytest.raises(httpx2.ConnectError):
            await client.get("http://127.0.0.1:9/")

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        await server.request(reader)

    async with (
        httpx2.AsyncClient(transport=HTTPXTransport(HTTPClient()), timeout=0.2) as client,
        serving(silent) as server,
        client.stream("GET", server.url + "/") as response,
    ):
        assert response.status_code == 200
        with pytest.raises(httpx2.ReadTimeout):
            await response.aread()


async def test_httpx2_over_the_client_resends_the_body_after_a_307() -> None:
    """httpx2 rebuilds the request to follow a redirect; its body must go out again."""
    moved = b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /there\r\nContent-Length: 0\r\n\r\n"
    async with serving(answering(moved, OK)) as server:
        async with HTTPXClient(HTTPClient(), follow_redirects=True) as client:
            response = await client.post(server.url + "/here", content=b'{"a": 1}')
        assert (response.status_code, response.text) == (200, "hello")
        assert server.requests[1].startswith(b"POST /there HTTP/1.1\r\n")
        assert server.requests[1].endswith(b'\r\n\r\n{"a": 1}')


async def test_the_sdk_client_sends_through_the_environments_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx2 reads HTTP(S)_PROXY only for transports it makes itself: HTTPXClient leaves
    it those, so a proxied origin goes through the proxy and the rest over botd's client."""
    async with serving(answering(OK)) as proxy, serving(answering(OK)) as direct:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", f"127.0.0.1:{direct.port}")
        async with HTTPXClient(HTTPClient()) as client:
            assert (await client.get("http://127.0.0.1:9/v1/models")).text == "hello"
            assert (await client.get(direct.url + "/v1/models")).text == "hello"
        assert proxy.requests[0].startswith(b"GET http://127.0.0.1:9/v1/models HTTP/1.1\r\n")
        assert direct.requests[0].startswith(b"GET /v1/models HTTP/1.1\r\n")


# -- on uvloop, botd's event loop (its transports are not asyncio's) -------------------------


@pytest.mark.parametrize("scenario", [
    test_a_request_goes_out_as_written_and_the_connection_is_kept,
    test_a_chunked_answer_streams_as_it_comes_and_the_connection_is_reused,
    test_an_answer_without_a_length_ends_with_the_connection,
    test_bytes_on_an_idle_connection_retire_it,
    test_a_large_body_arrives_whole_with_reading_paused_between,
    test_a_silent_server_is_a_read_timeout_and_the_connection_is_closed,
    test_nothing_listening_is_a_connect_error,
    test_a_cancelled_request_closes_its_connection,
], ids=lambda scenario: scenario.__name__.removeprefix("test_"))
def test_the_same_on_uvloop(scenario: Callable[[HTTPClient], Awaitable[None]]) -> None:
    async def main() -> None:
        http = HTTPClient(max_connections=4)
        try:
            await scenario(http)
        finally:
            await http.aclose()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
