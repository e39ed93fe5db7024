"""botd's client (``LeanRedis``, ``LeanPipeline``) reads replies straight off the
connection; what comes back must be what redis-py's own path gives, against a real Redis:
reply callbacks, errors in their places and annotated, a refused transaction, a lost
connection retried, a script the server does not know yet."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from bot.store.connection import create_client
from bot.store.pool import BoundedConnectionPool, LeanPipeline, LeanRedis


@pytest.fixture
async def clients(redis_url: str, redis_prefix: str) -> AsyncIterator[tuple[aioredis.Redis, aioredis.Redis, str]]:
    """(botd's client, redis-py's own on the same pool class, a key prefix)."""
    lean = create_client(redis_url)
    plain = aioredis.Redis.from_pool(BoundedConnectionPool.from_url(redis_url, decode_responses=True))
    assert isinstance(lean, LeanRedis) and not isinstance(plain, LeanRedis)
    try:
        yield lean, plain, f"{redis_prefix}:lean"
    finally:
        await lean.aclose()
        await plain.aclose()


async def both(clients: tuple[aioredis.Redis, aioredis.Redis, str], build: Any, **execute: Any) -> list[Any]:
    """Run the pipeline ``build`` fills on both clients (fresh keys each); both outcomes,
    replies or the error raised, as comparable values."""
    lean, plain, prefix = clients
    outcomes = []
    for name, client in (("lean", lean), ("plain", plain)):
        base = f"{prefix}:{name}"
        await client.delete(*(f"{base}:{k}" for k in "abcdz"))
        await client.set(f"{base}:z", "a string")
        pipe = build(client, base)
        if name == "lean":
            assert isinstance(pipe, LeanPipeline)
        try:
            outcomes.append(_comparable(await pipe.execute(**execute)))
        except ResponseError as exc:
            outcomes.append(("raised", type(exc).__name__, str(exc).replace(base, "<base>")))
    return outcomes


def _comparable(replies: list[Any]) -> list[Any]:
    return [(type(r).__name__, str(r).split(":")[0]) if isinstance(r, Exception) else r for r in replies]


def _usual(transaction: bool) -> Any:
    def build(client: aioredis.Redis, base: str) -> Any:
        pipe = client.pipeline(transaction=transaction)
        pipe.set(f"{base}:a", "1", px=60_000)
        pipe.get(f"{base}:a")
        pipe.hset(f"{base}:b", mapping={"x": "1", "y": "2"})
        pipe.hgetall(f"{base}:b")
        pipe.zadd(f"{base}:c", {"m": 1.5})
        pipe.zscore(f"{base}:c", "m")
        pipe.exists(f"{base}:a", f"{base}:d")
        pipe.eval("return {1, 'two', false}", 0)
        pipe.lpush(f"{base}:z", "wrong type")  # an error reply in the middle
        pipe.expire(f"{base}:a", 100)
        return pipe

    return build


@pytest.mark.parametrize("transaction", [True, False])
async def test_replies_and_callbacks_are_redis_pys(
    clients: tuple[aioredis.Redis, aioredis.Redis, str], transaction: bool
) -> None:
    lean, plain = await both(clients, _usual(transaction), raise_on_error=False)
    assert lean == plain
    assert lean[0] is True and lean[3] == {"x": "1", "y": "2"} and lean[5] == 1.5
    assert lean[8][0] == "ResponseError" and lean[9] is True


@pytest.mark.parametrize("transaction", [True, False])
async def test_the_first_error_is_raised_annotated_as_redis_py_does(
    clients: tuple[aioredis.Redis, aioredis.Redis, str], transaction: bool
) -> None:
    lean, plain = await both(clients, _usual(transaction))
    assert lean == plain
    assert lean[0] == "raised" and "Command # 9 (LPUSH <base>:z wrong type)" in lean[2]


async def test_a_refused_transaction_raises_the_refusal(clients: tuple[aioredis.Redis, aioredis.Redis, str]) -> None:
    def build(client: aioredis.Redis, base: str) -> Any:
        pipe = client.pipeline(transaction=True)
        pipe.set(f"{base}:a", "1")
        pipe.execute_command("SET", f"{base}:b")  # wrong arity: refused when queued
        return pipe

    lean, plain = await both(clients, build)
    assert lean == plain and lean[0] == "raised"
    lean_client, _, prefix = clients
    assert await lean_client.exists(f"{prefix}:lean:a") == 0  # EXECABORT: nothing ran


async def test_a_dropped_connection_is_retried(clients: tuple[aioredis.Redis, aioredis.Redis, str]) -> None:
    lean, plain, prefix = clients
    await lean.set(f"{prefix}:a", "before")
    # Every connection botd's client has open is cut; the next command and pipeline
    # find theirs dead and go again on a new one, as redis-py's own path does.
    await plain.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert await lean.get(f"{prefix}:a") == "before"
    await plain.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    pipe = lean.pipeline(transaction=True)
    pipe.set(f"{prefix}:a", "after")
    pipe.get(f"{prefix}:a")
    assert await pipe.execute() == [True, "after"]


async def test_a_script_unknown_to_the_server_is_loaded_and_run(
    clients: tuple[aioredis.Redis, aioredis.Redis, str],
) -> None:
    lean, _, prefix = clients
    script = lean.register_script("return 'ran ' .. ARGV[1] .. ' ' .. #KEYS")
    await lean.script_flush()
    assert await script(keys=[f"{prefix}:a"], args=["once"]) == "ran once 1"


async def test_options_that_change_reading_go_redis_pys_way(
    clients: tuple[aioredis.Redis, aioredis.Redis, str],
) -> None:
    lean, _, prefix = clients
    await lean.set(f"{prefix}:a", b"\xff raw")
    # NEVER_DECODE: the bytes as stored, though the client decodes replies.
    assert await lean.execute_command("GET", f"{prefix}:a", NEVER_DECODE=True) == b"\xff raw"
    pipe = lean.pipeline(transaction=False)
    pipe.execute_command("GET", f"{prefix}:a", NEVER_DECODE=True)
    assert await pipe.execute() == [b"\xff raw"]
