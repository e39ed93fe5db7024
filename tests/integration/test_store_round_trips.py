"""A round trip to the store costs no timer per buffered reply and no task per connection
handed back (``PromptWrite.read_response``, ``BoundedConnectionPool``), and still behaves
as redis-py's: errors keep their places, a reply cut short times out, a connection error
reply drops the connection, a connection that must reconnect does so before reuse."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.asyncio.connection as redis_connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bot.store.connection import create_client
from bot.store.pool import BoundedConnectionPool

HANDSHAKE = b"%1\r\n+proto\r\n:3\r\n" + b"+OK\r\n" * 3  # HELLO 3, then three CLIENT subcommands
MARKER = "botd-canned"

Serve = Callable[[bytes], Awaitable[int]]


@pytest.fixture
async def canned_server() -> AsyncIterator[Serve]:
    """``await serve(reply)`` starts a TCP server on 127.0.0.1 (its port returned) that
    answers the handshake, then writes ``reply`` once it has read ``MARKER``, then nothing."""
    servers: list[asyncio.Server] = []
    writers: list[asyncio.StreamWriter] = []

    async def serve(reply: bytes) -> int:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            writer.write(HANDSHAKE)
            seen = b""
            while MARKER.encode() not in seen:
                chunk = await reader.read(65536)
                if not chunk:
                    return
                seen += chunk
            writer.write(reply)
            await writer.drain()

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    yield serve
    for writer in writers:
        writer.close()
    for server in servers:
        server.close()
        await server.wait_closed()


def no_retries(port: int) -> aioredis.Redis:
    return create_client(
        f"redis://127.0.0.1:{port}/0", socket_timeout=0.3, retry=Retry(NoBackoff(), 0), retry_on_error=[],
        health_check_interval=0,
    )


async def test_buffered_replies_arm_no_timer(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client = create_client(redis_url)
    armed = 0
    real_timeout = redis_connection.async_timeout

    def counted(delay: float | None) -> Any:
        nonlocal armed
        armed += 1
        return real_timeout(delay)

    try:
        await client.ping()
        monkeypatch.setattr(redis_connection, "async_timeout", counted)
        async with client.pipeline(transaction=False) as pipe:
            for i in range(8):
                pipe.echo(f"reply-{i}")
            assert await pipe.execute() == [f"reply-{i}" for i in range(8)]
        # The first reply is waited for under the socket timeout; the rest came with it.
        # (A reply split over two socket reads would arm one more: never all eight.)
        assert 1 <= armed < 8
    finally:
        await client.aclose()


async def test_a_pipeline_starts_no_task(redis_url: str) -> None:
    client = create_client(redis_url)
    loop = asyncio.get_running_loop()
    started: list[str] = []
    factory = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        started.append(getattr(coro, "__qualname__", repr(coro)))
        return asyncio.Task(coro, loop=loop, **kwargs)

    try:
        await client.ping()
        loop.set_task_factory(counting)
        for transaction in (False, True):
            async with client.pipeline(transaction=transaction) as pipe:
                pipe.set("botd-test:round-trip", "v")
                pipe.get("botd-test:round-trip")
                pipe.delete("botd-test:round-trip")
                assert await pipe.execute() == [True, "v", 1]
        assert await client.get("botd-test:round-trip") is None
        assert started == []  # redis-py shields the release: a task each, unless already done
    finally:
        loop.set_task_factory(factory)
        await client.aclose()


async def test_error_replies_keep_their_places(redis_url: str) -> None:
    client = create_client(redis_url)
    try:
        await client.set("botd-test:not-a-number", "x")
        async with client.pipeline(transaction=False) as pipe:
            pipe.echo("before")
            pipe.incr("botd-test:not-a-number")
            pipe.echo("after")
            before, error, after = await pipe.execute(raise_on_error=False)
        assert (before, after) == ("before", "after")
        assert isinstance(error, ResponseError)
        async with client.pipeline(transaction=False) as pipe:
            pipe.echo("before")
            pipe.incr("botd-test:not-a-number")
            with pytest.raises(ResponseError, match="Command # 2"):
                await pipe.execute()
        # The connection went back clean: the next command reads its own reply.
        assert await client.echo("next") == "next"
    finally:
        await client.delete("botd-test:not-a-number")
        await client.aclose()


@pytest.mark.parametrize(
    ("second_reply", "error", "match"),
    [
        (b"$11\r\nhello", RedisTimeoutError, "Timeout reading"),  # the second reply never ends
        (b"-ERR max number of clients reached\r\n", RedisConnectionError, "max number of clients"),
    ],
    ids=["a reply cut short still times out", "a connection error reply drops the connection"],
)
async def test_a_broken_second_reply_drops_the_connection(
    canned_server: Serve, second_reply: bytes, error: type[Exception], match: str
) -> None:
    port = await canned_server(b"+OK\r\n" + second_reply)
    client = no_retries(port)
    try:
        async with client.pipeline(transaction=False) as pipe:
            pipe.echo(MARKER)
            pipe.echo("hello world")
            with pytest.raises(error, match=match):
                await asyncio.wait_for(pipe.execute(), 5)
        pool = client.connection_pool
        assert not any(c.is_connected for c in pool._available_connections)  # dropped, not reused
    finally:
        await client.aclose()


async def test_a_connection_comes_back_at_once_or_reconnected(redis_url: str) -> None:
    pool = BoundedConnectionPool.from_url(redis_url, max_connections=1, wait_s=5, decode_responses=True)
    client = aioredis.Redis.from_pool(pool)
    try:
        conn = await pool.get_connection()
        returned = pool.release(conn)
        assert returned.done()  # nothing to wait for: no task, no loop turn
        await returned
        conn = await pool.get_connection()
        waiter = asyncio.create_task(pool.get_connection())
        await asyncio.sleep(0.02)
        conn.mark_for_reconnect()  # e.g. a server's maintenance notice
        await pool.release(conn)
        again = await asyncio.wait_for(waiter, 2)  # the waiter is served the same connection...
        assert again is conn and not again.should_reconnect()  # ...reconnected first
        await pool.release(again)
        assert await client.ping()
    finally:
        await client.aclose()
