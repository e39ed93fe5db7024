"""A delivery claim the store applied but whose reply never came back.

The store can apply a step and die (or drop the connection) before its reply is written:
Valkey queues replies and writes them when its event loop sleeps, and a shutdown in
between leaves them unsent. The client then sees a connection error for a claim that
holds. A retry of that claim, by redis-py at once or by the run's resume once the store
is back, must read it as its own, or the answer is never sent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from bot.gateway import reply
from bot.gateway.reply import SENDING, DeliveryLedger
from bot.store.connection import RETRIES, create_client
from bot.store.pool import LeanPipeline
from tests.fakes.lost_replies import LostReplies
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.integration.gateway_harness import request_texts, roles, running_daemon


async def _answered_once(tmp_path: Path, redis_url: str, redis_prefix: str, lost: LostReplies) -> None:
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        fake.script(Reply.text("the answer that must arrive"))
        await bot.send("a question")
        await bot.channel.wait_for(lambda ch: ch.texts("part"), timeout=15)
        await bot.wait_idle(timeout=15)
        assert lost.left == 0 and lost.lost > 0, "the fault never fired"
        assert bot.channel.texts("part") == ["the answer that must arrive"]
        assert bot.channel.texts("notice") == []
        assert len(fake.requests) == 1, "the saved answer is delivered, the model not asked again"
        assert request_texts(fake.requests[0]) == ["a question"]
        history = await bot.history()
        assert roles(history) == ["user", "assistant"]
        [run_id] = {s.run_id for s in bot.channel.sent}
        assert run_id is not None
        states = await DeliveryLedger(bot.redis, redis_prefix).states(run_id)
        assert states["0"].startswith("sent:"), states


async def test_a_claim_retried_by_the_client_after_a_lost_reply_is_still_ours(
    tmp_path: Path, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One lost reply: redis-py sends the transaction again at once, to a server that applied it.
    await _answered_once(tmp_path, redis_url, redis_prefix, LostReplies(monkeypatch, ":delivery:", 1))


async def test_a_claim_lost_to_an_outage_is_taken_again_when_the_run_resumes(
    tmp_path: Path, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every try fails as the store goes away: the run ends on a store error and is resumed.
    await _answered_once(tmp_path, redis_url, redis_prefix, LostReplies(monkeypatch, ":delivery:", RETRIES + 1))


# ---- the ledger alone ----------------------------------------------------------------


async def test_a_claim_held_by_another_token_is_not_taken(store_client: aioredis.Redis, redis_prefix: str) -> None:
    mine, other = DeliveryLedger(store_client, redis_prefix), DeliveryLedger(store_client, redis_prefix)
    assert await other.claim("run-a", "0")  # another replica claimed it, and may have sent it
    assert not await mine.claim("run-a", "0")
    assert not await other.claim("run-a", "0")  # once claimed, even its owner does not claim again
    assert (await mine.states("run-a"))["0"].startswith(SENDING)


async def test_a_claim_in_doubt_is_taken_over_once_and_by_its_own_process_only(
    store_client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, other = DeliveryLedger(store_client, redis_prefix), DeliveryLedger(store_client, redis_prefix)
    LostReplies(monkeypatch, ":delivery:", RETRIES + 1)
    with pytest.raises(RedisConnectionError):
        await mine.claim("run-b", "0")
    held = (await mine.states("run-b"))["0"]
    assert held.startswith(SENDING), "the server applied the claim"
    assert not await other.claim("run-b", "0"), "another process cannot know nothing was sent"
    assert await mine.claim("run-b", "0"), "the process whose claim raised knows it sent nothing"
    assert (await mine.states("run-b"))["0"] == held
    assert not await mine.claim("run-b", "0"), "taken over once: the send that follows may happen"


async def test_a_claim_that_raised_before_reaching_the_store_is_taken_fresh(
    store_client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = DeliveryLedger(store_client, redis_prefix)

    async def down(*args: Any, **kwargs: Any) -> list[Any]:
        raise RedisConnectionError("Error 111 connecting to the store.")

    with monkeypatch.context() as patched:
        patched.setattr(LeanPipeline, "execute", down)
        with pytest.raises(RedisConnectionError):
            await ledger.claim("run-c", "0")
    assert await ledger.states("run-c") == {}
    assert await ledger.claim("run-c", "0")
    assert not await ledger.claim("run-c", "0")


async def test_claims_in_doubt_are_bounded(redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reply, "IN_DOUBT_KEPT", 3)
    once = create_client(redis_url, retry=Retry(NoBackoff(), 0))  # each lost reply raises at once
    ledger = DeliveryLedger(once, redis_prefix)
    LostReplies(monkeypatch, ":delivery:", 5)
    for n in range(5):
        with pytest.raises(RedisConnectionError):
            await ledger.claim(f"run-{n}", "0")
    monkeypatch.undo()
    # The oldest two fell out: their parts stay claimed (at most once), the newest three resume.
    assert [await ledger.claim(f"run-{n}", "0") for n in range(5)] == [False, False, True, True, True]
    await once.aclose()
