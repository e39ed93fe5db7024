"""A run's first steer is read together with its context (``SessionRun.queue_steer``), or
with the claim of its batch (``RunStart``, a lone message's intake): what it finds then
must count exactly as a steer of its own would, and only once."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from bot.gateway.inbox import Inbox
from bot.gateway.run_control import RunStart
from bot.gateway.session_run import CLAIM_COVERS_TAKE_S, SessionRun
from bot.gateway.signals import Broadcast, CancelSignals, server_time
from bot.store.sessions import SessionContext
from tests.integration.gateway_harness import chat_request, dm_session


def make_run(
    client: aioredis.Redis, prefix: str, started_at: float, *, steer_mode: bool = True, start: RunStart | None = None
) -> SessionRun:
    task = asyncio.current_task()
    assert task is not None
    return SessionRun(
        task, started_at=started_at, run_id="r1", session_key=dm_session(), inbox=Inbox(client, prefix),
        signals=CancelSignals(client, prefix, Broadcast(client)), steer_mode=steer_mode, start=start,
    )


def claimed_start(read_at: float, stop: str | None = None) -> RunStart:
    """What a lone message's intake read for its run: an empty context, ``stop`` as the stop key."""
    empty = SessionContext(messages=[], summary=None, model=None, usage=None, context_warned=False)  # type: ignore[arg-type]
    return RunStart(lambda: empty, stop, read_at)


async def assert_stopped_at_steer(run: SessionRun) -> None:
    with pytest.raises(asyncio.CancelledError):
        await run.steer()
    assert run.reason == "stopped"
    run.acknowledge()
    run.close()
    asyncio.current_task().uncancel()  # type: ignore[union-attr]


async def read_ahead(client: aioredis.Redis, run: SessionRun) -> None:
    pipe = client.pipeline(transaction=False)
    run.queue_steer(pipe)
    run.steer_ahead(await pipe.execute())


async def test_messages_read_ahead_are_steered_once(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    inbox = Inbox(redis_client, redis_prefix)
    run = make_run(redis_client, redis_prefix, await server_time(redis_client))
    await inbox.enqueue(chat_request("arrived while the run prepared"), 20)
    await read_ahead(redis_client, run)
    await inbox.enqueue(chat_request("arrived after the read"), 20)
    assert [r.text for r in await run.steer()] == ["arrived while the run prepared"]
    # The next steer asks the store again.
    assert [r.text for r in await run.steer()] == ["arrived after the read"]
    assert await run.steer() == []


@pytest.mark.parametrize("steer_mode", [True, False])
async def test_a_stop_read_ahead_cancels_before_the_first_model_call(
    redis_client: aioredis.Redis, redis_prefix: str, steer_mode: bool
) -> None:
    started = await server_time(redis_client)
    run = make_run(redis_client, redis_prefix, started, steer_mode=steer_mode)
    # A stop whose broadcast this replica missed: only the key tells.
    signals = CancelSignals(redis_client, redis_prefix, Broadcast(redis_client))
    await redis_client.set(signals.key(dm_session()), repr(started + 0.001), ex=60)
    await read_ahead(redis_client, run)
    await redis_client.delete(signals.key(dm_session()))  # what was read ahead decides
    await assert_stopped_at_steer(run)


async def test_a_stop_from_before_the_run_is_ignored(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    signals = CancelSignals(redis_client, redis_prefix, Broadcast(redis_client))
    await redis_client.set(signals.key(dm_session()), repr(await server_time(redis_client)), ex=60)
    run = make_run(redis_client, redis_prefix, await server_time(redis_client) + 0.01)
    await read_ahead(redis_client, run)
    assert await run.steer() == []
    assert run.reason is None


async def test_the_claim_stands_for_the_first_take_only_just_after_it(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    inbox = Inbox(redis_client, redis_prefix)
    started = await server_time(redis_client)
    fresh = make_run(redis_client, redis_prefix, started, start=claimed_start(time.monotonic()))
    await inbox.enqueue(chat_request("came right after the claim"), 20)
    assert fresh.start_context() is not None and fresh.start_context() is None  # handed over once
    assert await fresh.steer() == []  # no round trip: the claim took what waited
    assert [r.text for r in await fresh.steer()] == ["came right after the claim"]  # the next one asks
    slow = make_run(redis_client, redis_prefix, started, start=claimed_start(time.monotonic() - 2 * CLAIM_COVERS_TAKE_S))
    await inbox.enqueue(chat_request("came during a slow start"), 20)
    assert [r.text for r in await slow.steer()] == ["came during a slow start"]


async def test_a_stop_read_with_the_claim_cancels_at_the_first_steer(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    started = await server_time(redis_client)
    start = claimed_start(time.monotonic(), stop=repr(started + 0.001))
    await assert_stopped_at_steer(make_run(redis_client, redis_prefix, started, steer_mode=False, start=start))
