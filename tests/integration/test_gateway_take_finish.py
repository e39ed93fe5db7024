"""Taking a session's work with its lock, and finishing it with the release, each in one
step against a real Redis: who gets the batch, what stays queued, and that a lock taken
over by another holder is never touched."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from bot.gateway.inbox import Inbox
from bot.store import Keys, SessionLock
from tests.integration.gateway_harness import chat_request, dm_session

TTL = 0.6


@pytest.fixture
def keys(redis_prefix: str) -> Keys:
    return Keys(redis_prefix)


@pytest.fixture
def inbox(redis_client: aioredis.Redis, redis_prefix: str) -> Inbox:
    return Inbox(redis_client, redis_prefix)


def lock_for(client: aioredis.Redis, keys: Keys, **options: object) -> SessionLock:
    return SessionLock(client, keys, dm_session(), ttl_s=TTL, **options)  # type: ignore[arg-type]


async def test_lock_and_claim_takes_the_lock_and_every_waiting_message(
    redis_client: aioredis.Redis, keys: Keys, inbox: Inbox
) -> None:
    first, second = chat_request("one"), chat_request("two")
    await inbox.enqueue(first, 20)
    await inbox.enqueue(second, 20)
    lock = lock_for(redis_client, keys)
    claim = await inbox.lock_and_claim(dm_session(), lock)
    assert claim is not None and not claim.resumed
    assert [r.run_id for r in claim.batch] == [first.run_id, second.run_id]
    assert claim.server_time > 0
    assert lock.is_held and await redis_client.get(keys.lock(dm_session())) == lock.token
    assert await redis_client.llen(keys.inbox(dm_session())) == 0
    assert await redis_client.llen(keys.running(dm_session())) == 2
    await lock.release()


async def test_lock_and_claim_leaves_everything_to_the_holder(
    redis_client: aioredis.Redis, keys: Keys, inbox: Inbox
) -> None:
    await inbox.enqueue(chat_request("waiting"), 20)
    holder = lock_for(redis_client, keys)
    assert await holder.acquire(wait=False)
    late = lock_for(redis_client, keys)
    assert await inbox.lock_and_claim(dm_session(), late) is None
    assert not late.is_held and late.token is None
    # The claim ran in the same round trip but saw another token: nothing moved.
    assert await redis_client.llen(keys.inbox(dm_session())) == 1
    assert await redis_client.llen(keys.running(dm_session())) == 0
    assert await redis_client.get(keys.lock(dm_session())) == holder.token
    await holder.release()


async def test_lock_and_claim_resumes_what_a_dead_holder_left_running(
    redis_client: aioredis.Redis, keys: Keys, inbox: Inbox
) -> None:
    left = chat_request("taken just before the crash")
    await inbox.enqueue(left, 20)
    await inbox.take(dm_session())
    await inbox.enqueue(chat_request("arrived after"), 20)
    lock = lock_for(redis_client, keys)
    claim = await inbox.lock_and_claim(dm_session(), lock)
    assert claim is not None and claim.resumed
    assert [r.run_id for r in claim.batch] == [left.run_id]
    assert await redis_client.llen(keys.inbox(dm_session())) == 1  # the later one waits its turn
    await lock.release()


async def test_finish_with_nothing_waiting_releases_the_lock_in_the_same_step(
    redis_client: aioredis.Redis, keys: Keys, inbox: Inbox
) -> None:
    req = chat_request("the only one")
    await inbox.enqueue(req, 20)
    lost: list[str] = []
    lock = lock_for(redis_client, keys, on_lost=lambda: lost.append("lost"))
    claim = await inbox.lock_and_claim(dm_session(), lock)
    assert claim is not None
    await redis_client.set(keys.result(req.run_id), "{}")
    assert await inbox.finish(dm_session(), req.run_id, lock=lock) is False
    assert not lock.is_held and lock.token is None
    for key in (keys.lock(dm_session()), keys.running(dm_session()), keys.result(req.run_id)):
        assert await redis_client.exists(key) == 0
    assert await redis_client.zscore(keys.pending(), dm_session()) is None
    # The renewal timer is gone with it: nothing re-creates the key or reports a loss.
    await asyncio.sleep(TTL)
    assert await redis_client.exists(keys.lock(dm_session())) == 0
    assert lost == []


async def test_finish_with_messages_waiting_keeps_the_lock_for_the_next_batch(
    redis_client: aioredis.Redis, keys: Keys, inbox: Inbox
) -> None:
    req = chat_request("first")
    await inbox.enqueue(req, 20)
    lock = lock_for(redis_client, keys)
    assert await inbox.lock_and_claim(dm_session(), lock) is not None
    await inbox.enqueue(chat_request("arrived during the run"), 20)
    assert await inbox.finish(dm_session(), req.run_id, lock=lock) is True
    assert lock.is_held and await redis_client.get(keys.lock(dm_session())) == lock.token
    assert await redis_client.zscore(keys.pending(), dm_session()) is not None
    next_claim = await inbox.claim(dm_session())
    assert [r.text for r in next_claim.batch] == ["arrived during the run"]
    await lock.release()


async def test_finish_never_releases_a_lock_another_holder_took_over(
    redis_client: aioredis.Redis, keys: Keys, inbox: Inbox
) -> None:
    req = chat_request("slow run")
    await inbox.enqueue(req, 20)
    lock = lock_for(redis_client, keys, auto_renew=False)
    assert await inbox.lock_and_claim(dm_session(), lock) is not None
    await redis_client.set(keys.lock(dm_session()), "other-replica:1", px=5000)  # ours expired meanwhile
    assert await inbox.finish(dm_session(), req.run_id, lock=lock) is False
    assert await redis_client.get(keys.lock(dm_session())) == "other-replica:1"
    assert lock.token is None  # not ours any more: let go, the key untouched
    # The running list is the holder's now: left to it (it resumes the batch, whose answer
    # was saved and whose parts are claimed, so nothing is asked or sent again).
    assert [r.run_id for r in await inbox.running(dm_session())] == [req.run_id]
