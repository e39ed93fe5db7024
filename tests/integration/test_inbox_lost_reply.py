"""Queueing and taking messages when the store's reply is lost.

A take moves the inbox into the running list. Applied once and sent again by redis-py
(its reply lost), a second move would find the inbox empty and hand the run nothing,
and the messages it moved would go when the batch finishes. A take sent again must
hand over what the first one moved. An enqueue sent again must not queue the message
twice, with a dedupe key (platform messages) or without one (the console)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from bot.gateway.inbox import RUN_MARK_TTL_S, TAKEN_KEEP_MS, Inbox
from bot.gateway.signals import server_time
from bot.store.keys import Keys
from bot.store.locks import SessionLock
from tests.fakes.lost_replies import LostReplies
from tests.integration.gateway_harness import chat_request, dm_session
from tests.integration.test_gateway_steer_ahead import make_run, read_ahead

SCRIPTS = ("EVAL", "EVALSHA")


async def waiting(inbox: Inbox, *texts: str) -> None:
    for text in texts:
        await inbox.enqueue(chat_request(text), 20)


async def running_texts(inbox: Inbox) -> list[str]:
    return [r.text for r in await inbox.running(dm_session())]


async def test_a_take_sent_again_hands_over_what_it_moved(
    store_client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = Inbox(store_client, redis_prefix)
    await waiting(inbox, "one", "two")
    lost = LostReplies(monkeypatch, ":inbox:", 1, commands=SCRIPTS)
    assert [r.text for r in await inbox.take(dm_session())] == ["one", "two"]
    assert lost.lost == 1
    assert await running_texts(inbox) == ["one", "two"]  # moved once
    [record] = await store_client.keys(Keys(redis_prefix).pattern("taken"))  # the take's count, for a while only
    assert 0 < await store_client.pttl(record) <= TAKEN_KEEP_MS
    await waiting(inbox, "three")
    assert [r.text for r in await inbox.take(dm_session())] == ["three"]  # the next take is its own
    assert await inbox.take(dm_session()) == []


async def test_a_take_with_a_read_sent_again_hands_over_what_it_moved(
    store_client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = Inbox(store_client, redis_prefix)
    await waiting(inbox, "steered")
    lost = LostReplies(monkeypatch, ":inbox:", 1, commands=SCRIPTS)
    taken, _ = await inbox.take_reading(dm_session(), "some-other-key")
    assert [r.text for r in taken] == ["steered"] and lost.lost == 1
    assert await running_texts(inbox) == ["steered"]


async def test_a_steer_read_ahead_sent_again_still_steers(
    store_client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = Inbox(store_client, redis_prefix)
    run = make_run(store_client, redis_prefix, await server_time(store_client))
    await waiting(inbox, "arrived while the run prepared")
    lost = LostReplies(monkeypatch, ":inbox:", 1, commands=SCRIPTS)
    await read_ahead(store_client, run)
    assert lost.lost == 1
    assert [r.text for r in await run.steer()] == ["arrived while the run prepared"]
    run.close()


async def test_an_empty_take_sent_again_leaves_nothing_behind(
    store_client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = Inbox(store_client, redis_prefix)
    LostReplies(monkeypatch, ":inbox:", 1, commands=SCRIPTS)
    assert await inbox.take(dm_session()) == []
    before = set(await store_client.keys(Keys(redis_prefix).every_key()))
    assert await inbox.take(dm_session()) == []
    assert set(await store_client.keys(Keys(redis_prefix).every_key())) == before


@pytest.mark.parametrize("dedupe_key", [None, "telegram:update:7"])
async def test_an_enqueue_sent_again_queues_the_message_once(
    store_client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, dedupe_key: str | None
) -> None:
    inbox = Inbox(store_client, redis_prefix)
    lost = LostReplies(monkeypatch, ":inbox:", 1, commands=SCRIPTS)
    await inbox.enqueue(chat_request("typed once"), 20, dedupe_key=dedupe_key)
    assert lost.lost == 1
    assert [r.text for r in await inbox.take(dm_session())] == ["typed once"]


@pytest.mark.parametrize("dedupe_key", [None, "telegram:update:8"])
async def test_an_enqueue_sent_again_after_its_message_was_answered_is_a_duplicate(
    store_client: aioredis.Redis, redis_prefix: str, dedupe_key: str | None
) -> None:
    # The retry may come after the backoff, by when a fast run may have answered it.
    inbox = Inbox(store_client, redis_prefix)
    req = chat_request("answered before the retry")
    assert not (await inbox.enqueue(req, 20, dedupe_key=dedupe_key)).duplicate
    assert [r.text for r in await inbox.take(dm_session())] == ["answered before the retry"]
    await inbox.finish(dm_session(), req.run_id)
    assert (await inbox.enqueue(req, 20, dedupe_key=dedupe_key)).duplicate
    assert await inbox.take(dm_session()) == []
    if dedupe_key is None:  # marked by its run id, for a while only
        assert 0 < await store_client.ttl(Keys(redis_prefix).run_mark(req.run_id)) <= RUN_MARK_TTL_S


async def test_a_finish_sent_again_still_lets_go_of_the_lock(
    store_client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first finish released the lock; its retry finds the key gone, which must not
    # leave this process renewing a lock it no longer holds (and then calling it lost).
    inbox = Inbox(store_client, redis_prefix)
    lock = SessionLock(store_client, Keys(redis_prefix), dm_session(), ttl_s=3)
    await waiting(inbox, "answered")
    claim = await inbox.lock_and_claim(dm_session(), lock)
    assert claim is not None and lock.is_held
    LostReplies(monkeypatch, ":running:", 1, commands=SCRIPTS)
    assert not await inbox.finish(dm_session(), claim.batch[0].run_id, lock=lock)
    assert lock.token is None and not lock.is_held
    assert await store_client.exists(lock.key) == 0


async def test_a_finish_sent_again_leaves_the_next_holder_its_batch(
    store_client: aioredis.Redis, redis_client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first finish released the lock; before its retry, a new message took the lock and
    # its batch. The retry must not delete that batch, the new holder's to finish.
    inbox = Inbox(store_client, redis_prefix)
    lock = SessionLock(store_client, Keys(redis_prefix), dm_session(), ttl_s=3)
    await waiting(inbox, "answered")
    claim = await inbox.lock_and_claim(dm_session(), lock)
    assert claim is not None

    async def next_message_taken() -> None:
        other = Inbox(redis_client, redis_prefix)
        await other.enqueue(chat_request("arrived meanwhile"), 20)
        assert await other.lock_and_claim(dm_session(), SessionLock(redis_client, Keys(redis_prefix), dm_session(),
                                                                    ttl_s=3, auto_renew=False))

    LostReplies(monkeypatch, ":running:", 1, commands=SCRIPTS, meanwhile=next_message_taken)
    assert not await inbox.finish(dm_session(), claim.batch[0].run_id, lock=lock)
    assert lock.token is None and not lock.is_held
    assert await running_texts(inbox) == ["arrived meanwhile"]
