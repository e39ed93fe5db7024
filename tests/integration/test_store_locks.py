"""SessionLock and Lease against a real Redis: exclusion, ownership, expiry, watchdog, loss."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from bot.config import RedisConfig
from bot.store import Keys, Lease, LockTimeout, SessionLock, open_redis
from bot.store.embedded import EmbeddedPaths
from bot.store.valkey_process import send_shutdown

SK = "agent:main:telegram:dm:7"
TTL = 1.0


@pytest.fixture
def keys(redis_prefix: str) -> Keys:
    return Keys(redis_prefix)


async def test_mutual_exclusion_between_two_holders(redis_client: aioredis.Redis, keys: Keys) -> None:
    a = SessionLock(redis_client, keys, SK, ttl_s=TTL, owner="replica-a")
    b = SessionLock(redis_client, keys, SK, ttl_s=TTL, owner="replica-b")
    assert await a.acquire(wait=False)
    assert a.is_held and a.token is not None and a.token.startswith("replica-a:")
    assert await redis_client.get(keys.lock(SK)) == a.token
    assert await b.holder() == a.token
    assert not await b.acquire(wait=False)
    assert not await b.acquire(wait=True, timeout_s=0.3)
    assert await a.release()
    assert not a.is_held
    assert await b.acquire(wait=False)
    await b.release()
    assert await redis_client.exists(keys.lock(SK)) == 0


async def test_async_with_never_overlaps(redis_client: aioredis.Redis, keys: Keys) -> None:
    events: list[tuple[str, int]] = []

    async def worker(n: int) -> None:
        async with SessionLock(redis_client, keys, SK, ttl_s=TTL) as lock:
            assert lock.is_held and lock.session_key == SK
            events.append(("enter", n))
            await asyncio.sleep(0.05)
            events.append(("exit", n))

    await asyncio.gather(*(worker(n) for n in range(4)))
    assert len(events) == 8
    for i in range(0, 8, 2):
        assert events[i][0] == "enter" and events[i + 1] == ("exit", events[i][1])


async def test_release_by_a_non_owner_is_a_no_op(redis_client: aioredis.Redis, keys: Keys) -> None:
    a = SessionLock(redis_client, keys, SK, ttl_s=TTL)
    never = SessionLock(redis_client, keys, SK, ttl_s=TTL)
    await a.acquire()
    assert await never.release() is False
    assert await redis_client.get(keys.lock(SK)) == a.token
    await a.release()


async def test_ttl_expiry_lets_another_take_over(redis_client: aioredis.Redis, keys: Keys) -> None:
    crashed = SessionLock(redis_client, keys, SK, ttl_s=TTL, auto_renew=False)
    other = SessionLock(redis_client, keys, SK, ttl_s=TTL)
    assert await crashed.acquire()
    assert await other.acquire(wait=True, timeout_s=10)
    assert not crashed.is_held
    # The stale holder's release must not delete the new holder's lock.
    assert await crashed.release() is False
    assert await redis_client.get(keys.lock(SK)) == other.token
    await other.release()


async def test_watchdog_renews_beyond_the_ttl(redis_client: aioredis.Redis, keys: Keys) -> None:
    lost: list[str] = []
    ttl = 2.0  # renewed every ~0.67 s: a loaded machine still has a wide margin
    a = SessionLock(redis_client, keys, SK, ttl_s=ttl, on_lost=lambda: lost.append("lost"))
    b = SessionLock(redis_client, keys, SK, ttl_s=ttl)
    await a.acquire()
    await asyncio.sleep(ttl * 2.25)
    assert a.is_held and not lost
    assert not await b.acquire(wait=False)
    assert await redis_client.pttl(keys.lock(SK)) > 0
    assert await a.release()
    assert await redis_client.exists(keys.lock(SK)) == 0


@pytest.mark.parametrize("how", ["deleted", "stolen"])
async def test_on_lost_fires_when_the_key_is_deleted_or_stolen(
    redis_client: aioredis.Redis, keys: Keys, how: str
) -> None:
    fired = asyncio.Event()

    async def on_lost() -> None:  # async callbacks are awaited
        fired.set()

    a = SessionLock(redis_client, keys, SK, ttl_s=TTL, on_lost=on_lost)
    await a.acquire()
    if how == "deleted":
        await redis_client.delete(keys.lock(SK))
    else:
        await redis_client.set(keys.lock(SK), "someone-else", px=10_000)
    await asyncio.wait_for(fired.wait(), timeout=10)
    await asyncio.wait_for(a.wait_lost(), timeout=1)
    assert not a.is_held
    await a.release()
    if how == "stolen":
        assert await redis_client.get(keys.lock(SK)) == "someone-else"


@pytest.fixture
async def quick_renewals(redis_client: aioredis.Redis, keys: Keys) -> AsyncIterator[tuple[SessionLock, list[str]]]:
    """A held lock renewed every 0.2 s, and the record of its ``on_lost`` calls."""
    lost: list[str] = []
    lock = SessionLock(redis_client, keys, SK, ttl_s=0.6, on_lost=lambda: lost.append("lost"))
    await lock.acquire()
    yield lock, lost
    await lock.release()


async def test_a_renewal_racing_the_holders_own_delete_is_not_a_loss(
    redis_client: aioredis.Redis, keys: Keys, quick_renewals: tuple[SessionLock, list[str]]
) -> None:
    # The worker's last finish deletes the lock in its script and forgets it on the reply;
    # a renewal in between finds the key gone.
    lock, lost = quick_renewals
    async with lock.releasing():
        await redis_client.delete(keys.lock(SK))
        await asyncio.sleep(0.6)  # renewals every 0.2 s find the key gone meanwhile
        lock.forget()
    await asyncio.sleep(0.3)
    assert lost == [] and lock.token is None and not lock.is_held


async def test_a_key_taken_during_a_step_that_kept_it_is_lost_after_the_step(
    redis_client: aioredis.Redis, keys: Keys, quick_renewals: tuple[SessionLock, list[str]]
) -> None:
    lock, lost = quick_renewals
    async with lock.releasing():
        await redis_client.set(keys.lock(SK), "someone-else", px=10_000)
        await asyncio.sleep(0.6)
        assert lost == []  # the renewal waits for the step's verdict
    await asyncio.wait_for(lock.wait_lost(), timeout=5)
    assert lost == ["lost"] and not lock.is_held
    await lock.release()
    assert await redis_client.get(keys.lock(SK)) == "someone-else"


async def test_on_lost_fires_when_redis_is_unreachable_for_a_ttl(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    handle = await open_redis(RedisConfig(), ws)
    try:
        lost = asyncio.Event()
        lock = SessionLock(handle.client, handle.keys, SK, ttl_s=TTL, on_lost=lost.set)
        await lock.acquire()
        paths = EmbeddedPaths.for_workspace(ws)
        await asyncio.to_thread(send_shutdown, paths.socket, paths.password.read_text().strip())
        await asyncio.wait_for(lost.wait(), timeout=15)
        assert not lock.is_held
        assert await lock.release() is False  # logged, not raised
    finally:
        await handle.close()


async def test_release_from_inside_on_lost_does_not_deadlock(
    redis_client: aioredis.Redis, keys: Keys
) -> None:
    done = asyncio.Event()
    lock: SessionLock

    async def on_lost() -> None:
        await lock.release()
        done.set()

    lock = SessionLock(redis_client, keys, SK, ttl_s=TTL, on_lost=on_lost)
    await lock.acquire()
    await redis_client.delete(keys.lock(SK))
    await asyncio.wait_for(done.wait(), timeout=10)
    assert lock.token is None


async def test_a_failing_on_lost_callback_is_contained(redis_client: aioredis.Redis, keys: Keys) -> None:
    def on_lost() -> None:
        raise RuntimeError("boom")

    lock = SessionLock(redis_client, keys, SK, ttl_s=TTL, on_lost=on_lost)
    await lock.acquire()
    await redis_client.delete(keys.lock(SK))
    await asyncio.wait_for(lock.wait_lost(), timeout=10)
    await lock.release()


async def test_async_with_times_out_with_a_clear_error(redis_client: aioredis.Redis, keys: Keys) -> None:
    holder = SessionLock(redis_client, keys, SK, ttl_s=TTL)
    await holder.acquire()
    try:
        with pytest.raises(LockTimeout, match="lock"):
            async with SessionLock(redis_client, keys, SK, ttl_s=TTL, acquire_timeout_s=0.2):
                pass
    finally:
        await holder.release()


async def test_acquire_twice_and_bad_ttl_are_errors(redis_client: aioredis.Redis, keys: Keys) -> None:
    lock = SessionLock(redis_client, keys, SK, ttl_s=TTL)
    await lock.acquire()
    with pytest.raises(RuntimeError, match="already held"):
        await lock.acquire()
    await lock.release()
    with pytest.raises(ValueError, match="TTL"):
        SessionLock(redis_client, keys, SK, ttl_s=0)


async def test_lease_elects_one_leader_and_hands_over(redis_client: aioredis.Redis, keys: Keys) -> None:
    key = keys.compaction(SK)
    replicas = [Lease(redis_client, key, ttl_s=TTL, owner=f"replica-{i}") for i in range(3)]
    won = await asyncio.gather(*(r.acquire(wait=False) for r in replicas))
    assert sum(won) == 1
    leader = replicas[won.index(True)]
    followers = [r for r in replicas if r is not leader]
    assert leader.is_held and not any(f.is_held for f in followers)

    await leader.release()  # e.g. a graceful shutdown
    took = await asyncio.gather(*(f.acquire(wait=False) for f in followers))
    assert sorted(took) == [False, True]
    new_leader = followers[took.index(True)]
    assert new_leader.is_held and await new_leader.holder() == new_leader.token
    await new_leader.release()
    # A released lease can be taken again by the same object.
    assert await leader.acquire(wait=False)
    await leader.release()
