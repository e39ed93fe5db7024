"""A lone message's run reads its start (history, summary, meta, the stop key) in the
round trip that queues the message and claims it (``Workers.read_ahead``), not in one of
its own; against the fake OpenAI server and a real Redis.

Read before the run is registered, that stop check could miss a stop written after it:
a stop seen meanwhile (this replica's /stop, or another's broadcast) is kept for the run
and applied when it registers. The history is read only while the new lock is ours, and
a batch that starts a fresh session reads it again after the reset. How the first steer
uses what the claim read: ``test_gateway_steer_ahead.py``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from agent.types import Message
from bot.gateway.run_control import RunStart
from bot.gateway.signals import Broadcast, CancelSignals
from bot.store.keys import Keys
from bot.store.locks import Lease
from bot.store.sessions import SessionStore
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.integration.gateway_harness import (
    Bot,
    chat_request,
    dm_session,
    request_texts,
    roles,
    running_daemon,
    wait_until,
)


async def claim_by_hand(bot: Bot, text: str) -> tuple[object, object]:
    """What ``Gateway._enqueue`` does up to handing the claim over: the lock, the claim."""
    session = dm_session()
    lock = bot.gateway.workers.claim_lock(session)
    assert lock is not None
    _, claim = await bot.gateway.inbox.enqueue_and_claim(
        chat_request(text), 20, lock, ahead=bot.gateway.workers.read_ahead(session)
    )
    assert claim is not None and isinstance(claim.ahead, RunStart)
    return lock, claim


async def test_a_lone_message_runs_on_the_history_read_with_its_intake(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str
) -> None:
    fake.script(Reply.text("first answer"), Reply.text("second answer"))
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        await bot.send("first")
        await bot.wait_idle()
        await bot.send("second")
        await bot.wait_idle()
        # The second run saw the first turn: the history read with its intake was the run's.
        assert request_texts(fake.requests[1]) == ["first", "second"]
        assert request_texts(fake.requests[1], "assistant") == ["first answer"]
        assert roles(await bot.history()) == ["user", "assistant", "user", "assistant"]


async def test_a_stop_after_the_intake_read_stops_the_run_when_it_registers(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str
) -> None:
    fake.script(Reply.text("must not be asked for"))
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        session = dm_session()
        lock, claim = await claim_by_hand(bot, "stop me")
        # The /stop lands after the claim read the stop key, before the run is registered.
        await bot.gateway.stop_session(session)
        bot.gateway.workers.claim_returned(session, lock, claim)  # type: ignore[arg-type]
        await bot.wait_idle()
        assert fake.requests == []
        assert bot.channel.texts("part") == []
        assert session not in bot.gateway.workers._early_stops


async def test_a_broadcast_stop_during_the_intake_stops_the_run(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str
) -> None:
    fake.script(Reply.text("must not be asked for"))
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        session = dm_session()
        lock, claim = await claim_by_hand(bot, "stopped from elsewhere")
        # Another replica's /stop: the key, then the broadcast, which reaches this replica
        # while the claim is still on its way to the worker.
        other = CancelSignals(bot.redis, bot.cfg.redis.prefix, Broadcast(bot.redis))
        await other.request(session)
        await wait_until(lambda: session in bot.gateway.workers._early_stops, what="the broadcast")
        bot.gateway.workers.claim_returned(session, lock, claim)  # type: ignore[arg-type]
        await bot.wait_idle()
        assert fake.requests == []


async def test_a_stop_from_before_the_message_does_not_stop_its_run(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str
) -> None:
    fake.script(Reply.text("answered"))
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        await bot.gateway.stop_session(dm_session())  # nothing to stop; its key stays
        await bot.send("after the stop")
        await bot.wait_idle()
        assert bot.channel.texts("part") == ["answered"]
        assert not bot.gateway.workers._early_stops


async def test_a_fresh_session_reads_its_history_again_after_the_reset(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str
) -> None:
    fake.script(Reply.text("old answer"), Reply.text("fresh answer"))
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        await bot.send("old turn")
        await bot.wait_idle()
        req = chat_request("a fresh start")
        req.meta["fresh_session"] = "1"
        await bot.submit(req)
        await bot.wait_idle()
        assert request_texts(fake.requests[1]) == ["a fresh start"]
        assert roles(await bot.history()) == ["user", "assistant"]


async def test_a_claim_refused_hands_over_no_start(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str
) -> None:
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        session = dm_session()
        other = Lease(bot.redis, bot.keys.lock(session), ttl_s=30, owner="other-replica", auto_renew=False)
        assert await other.acquire(wait=False)
        lock = bot.gateway.workers.claim_lock(session)
        assert lock is not None
        read: list[object] = []

        def ahead(pipe: Pipeline) -> Callable[[list[Any]], object]:
            bot.gateway.workers.read_ahead(session)(pipe)
            return read.append
        _, claim = await bot.gateway.inbox.enqueue_and_claim(chat_request("held elsewhere"), 20, lock, ahead=ahead)
        bot.gateway.workers.claim_returned(session, lock, claim)
        assert claim is None and read == []  # what was read for a run is not used by anyone
        await other.release()


async def test_the_start_read_decodes_as_the_run_s_own_read(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    sessions = SessionStore(redis_client, Keys(redis_prefix))
    session = dm_session()
    await sessions.append(session, "r0", [Message.user("kept"), Message.assistant("yes")])
    await sessions.record_usage(session, 12, 3)
    pipe = redis_client.pipeline(transaction=False)
    read = sessions.queue_context(pipe, session)
    context = read(await pipe.execute())()
    assert context == await sessions.context(session)
    assert [m.content for m in context.messages] == ["kept", "yes"] and context.usage.total_prompt_tokens == 12
