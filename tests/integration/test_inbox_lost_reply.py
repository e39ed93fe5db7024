"""Taking waiting messages into a run when the store's reply to the take is lost.

A take moves the inbox into the running list. Applied once and sent again by redis-py
(its reply lost), a second move would find the inbox empty and hand the run nothing,
and the messages it moved would go when the batch finishes. A take sent again must
hand over what the first one moved."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from bot.gateway.inbox import TAKEN_KEEP_MS, Inbox
from bot.gateway.signals import server_time
from bot.store.connection import create_client
from tests.fakes.lost_replies import LostReplies
from tests.integration.gateway_harness import chat_request, dm_session
from tests.integration.test_gateway_steer_ahead import make_run, read_ahead

SCRIPTS = ("EVAL", "EVALSHA")


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """The daemon's own kind of client: it retries a request whose reply was lost."""
    made = create_client(redis_url)
    try:
        yield made
    finally:
        await made.aclose()


async def waiting(inbox: Inbox, *texts: str) -> None:
    for text in texts:
        await inbox.enqueue(chat_request(text), 20)


async def running_texts(inbox: Inbox) -> list[str]:
    return [r.text for r in await inbox.running(dm_session())]


async def test_a_take_sent_again_hands_over_what_it_moved(
    client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = Inbox(client, redis_prefix)
    await waiting(inbox, "one", "two")
    lost = LostReplies(monkeypatch, ":inbox:", 1, commands=SCRIPTS)
    assert [r.text for r in await inbox.take(dm_session())] == ["one", "two"]
    assert lost.lost == 1
    assert await running_texts(inbox) == ["one", "two"]  # moved once
    [record] = await client.keys(f"{redis_prefix}:taken:*")  # the take's count, for a while only
    assert 0 < await client.pttl(record) <= TAKEN_KEEP_MS
    await waiting(inbox, "three")
    assert [r.text for r in await inbox.take(dm_session())] == ["three"]  # the next take is its own
    assert await inbox.take(dm_session()) == []


async def test_a_take_with_a_read_sent_again_hands_over_what_it_moved(
    client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = Inbox(client, redis_prefix)
    await waiting(inbox, "steered")
    lost = LostReplies(monkeypatch, ":inbox:", 1, commands=SCRIPTS)
    taken, _ = await inbox.take_reading(dm_session(), "some-other-key")
    assert [r.text for r in taken] == ["steered"] and lost.lost == 1
    assert await running_texts(inbox) == ["steered"]


async def test_a_steer_read_ahead_sent_again_still_steers(
    client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = Inbox(client, redis_prefix)
    run = make_run(client, redis_prefix, await server_time(client))
    await waiting(inbox, "arrived while the run prepared")
    lost = LostReplies(monkeypatch, ":inbox:", 1, commands=SCRIPTS)
    await read_ahead(client, run)
    assert lost.lost == 1
    assert [r.text for r in await run.steer()] == ["arrived while the run prepared"]
    run.close()


async def test_an_empty_take_sent_again_leaves_nothing_behind(
    client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = Inbox(client, redis_prefix)
    LostReplies(monkeypatch, ":inbox:", 1, commands=SCRIPTS)
    assert await inbox.take(dm_session()) == []
    before = set(await client.keys(f"{redis_prefix}:*"))
    assert await inbox.take(dm_session()) == []
    assert set(await client.keys(f"{redis_prefix}:*")) == before
