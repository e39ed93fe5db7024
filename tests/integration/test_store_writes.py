"""The store's connections pack commands in C and write without a timer per command, yet
a write a server does not take still times out (``PromptWrite``)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection
from redis.exceptions import DataError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bot.store.connection import create_client
from bot.store.pool import BoundedConnectionPool, PromptWrite


@pytest.fixture
async def deaf_server() -> AsyncIterator[int]:
    """A TCP server that never reads what it is sent. It answers redis-py's handshake up
    front (HELLO 3, then three CLIENT subcommands), so connecting works."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        writer.write(b"%1\r\n+proto\r\n:3\r\n" + b"+OK\r\n" * 3)
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "unix:///tmp/botd-test.sock"])
def test_every_kind_of_connection_writes_promptly(url: str) -> None:
    pool = BoundedConnectionPool.from_url(url)
    assert issubclass(pool.connection_class, PromptWrite)
    assert pool.connection_class.__name__.startswith("PromptWrite")


PACKED: list[tuple[object, ...]] = [
    ("GET", "k"),
    ("CONFIG GET", "maxmemory"),  # a two-word command name goes as two arguments
    (b"CONFIG GET", "maxmemory"),
    ("get", "k"),
    ("EVALSHA", "0" * 40, 2, "a", "b", "x" * 300, 1795541469.3267174, 12, b"raw"),
    ("EVAL", "return 1", 1, "k", 1.5, -0.0, 10**20, b"\x00\xff", "é", memoryview(b"ab"), bytearray(b"cd")),
]


@pytest.mark.parametrize("args", PACKED)
def test_commands_are_packed_as_redis_py_packs_them(args: tuple[object, ...]) -> None:
    prompt = BoundedConnectionPool.from_url("redis://127.0.0.1:6379/0").connection_class()
    assert b"".join(prompt.pack_command(*args)) == b"".join(Connection().pack_command(*args))


def test_a_pipeline_is_packed_as_redis_py_packs_it() -> None:
    prompt = BoundedConnectionPool.from_url("redis://127.0.0.1:6379/0").connection_class()
    commands = [("SET", "k", "v" * 10_000), ("GET", "k"), ("DEL", "k")]
    assert b"".join(prompt.pack_commands(commands)) == b"".join(Connection().pack_commands(commands))


@pytest.mark.parametrize("value", [None, True, object()])
def test_a_value_redis_cannot_take_is_a_data_error(value: object) -> None:
    prompt = BoundedConnectionPool.from_url("redis://127.0.0.1:6379/0").connection_class()
    with pytest.raises(DataError):
        prompt.pack_command("SET", "k", value)
    with pytest.raises(UnicodeEncodeError):
        prompt.pack_command("SET", "k", "\udc80")


async def test_commands_round_trip(redis_url: str) -> None:
    client = create_client(redis_url)
    try:
        await client.set("botd-test:prompt-write", "v" * 100_000)  # larger than one socket write
        assert await client.get("botd-test:prompt-write") == "v" * 100_000
        async with client.pipeline(transaction=False) as pipe:
            pipe.strlen("botd-test:prompt-write")
            pipe.delete("botd-test:prompt-write")
            assert await pipe.execute() == [100_000, 1]
    finally:
        await client.aclose()


async def test_a_write_the_server_never_takes_times_out(deaf_server: int) -> None:
    pool = BoundedConnectionPool.from_url(
        f"redis://127.0.0.1:{deaf_server}/0", socket_timeout=0.3, socket_connect_timeout=1.0,
    )
    client = aioredis.Redis.from_pool(pool)
    try:
        connection = await pool.get_connection()
        await connection.connect()
        big = b"x" * (32 * 1024 * 1024)  # far more than both socket buffers hold
        with pytest.raises(RedisTimeoutError, match="Timeout writing"):
            await asyncio.wait_for(connection.send_packed_command([big], check_health=False), timeout=10)
        assert not connection.is_connected  # half a command may be on the wire: dropped
    finally:
        await client.aclose()
