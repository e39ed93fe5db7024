"""Failures between replicas: a lost lock, a dead holder, a retried run that already
delivered part of its answer, and shutting down with runs in progress."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from agent.types import Message, RunResult
from bot.gateway.inbox import Inbox
from bot.gateway.reply import DeliveryLedger
from bot.store.connection import RETRIES
from bot.store.keys import Keys
from tests.fakes.lost_replies import LostReplies
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.recording_channel import RecordingChannel
from tests.integration.gateway_harness import (
    Gate,
    chat_request,
    dm_session,
    request_texts,
    roles,
    running_daemon,
    wait_until,
)


async def test_lost_lock_cancels_the_run_and_the_batch_is_answered_once(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    gate = Gate(Reply.text("the one answer"))
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot,
    ):
        await bot.send("question")
        await gate.wait_waiting(1)
        lock_key = bot.keys.lock(dm_session())
        first_holder = await bot.redis.get(lock_key)
        assert first_holder is not None
        await bot.redis.delete(lock_key)  # e.g. it expired while this replica was stalled
        # The watchdog notices within a third of the TTL, cancels the run, and the batch is retried.
        await gate.wait_hung_up(1, timeout=5)
        await gate.wait_waiting(1)
        assert bot.gateway.busy_locally()  # the retrying worker is tracked (shutdown waits for it)
        assert await bot.redis.get(lock_key) not in (None, first_holder)
        gate.release()
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        await bot.wait_idle()
        assert bot.channel.texts("part") == ["the one answer"]
        assert len(fake.requests) == 2
        assert request_texts(fake.requests[1]) == ["question"]
        history = await bot.history()
        assert roles(history) == ["user", "assistant"]  # the cancelled attempt recorded nothing


async def _leave_work_behind(client: aioredis.Redis, prefix: str, text: str) -> str:
    """What a replica that died mid-run leaves: the batch taken into the running list."""
    req = chat_request(text)
    inbox = Inbox(client, prefix)
    await inbox.enqueue(req, 20)
    assert [r.run_id for r in await inbox.take(req.session_key)] == [req.run_id]
    return req.run_id


async def test_sweeper_takes_over_from_a_dead_holder(
    tmp_path: Path, redis_url: str, redis_prefix: str, redis_client: aioredis.Redis
) -> None:
    run_id = await _leave_work_behind(redis_client, redis_prefix, "asked just before the crash")
    lock_key = f"{redis_prefix}:lock:{dm_session()}"
    await redis_client.set(lock_key, "dead-replica:0123", px=1500)
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        fake.script(Reply.text("answered after the takeover"))
        await bot.channel.wait_for(lambda ch: ch.texts("part"), timeout=8)
        await bot.wait_idle()
        assert bot.channel.texts("part") == ["answered after the takeover"]
        assert bot.channel.opened == [(run_id, True)]  # resumed: it looks for the dead holder's preview
        assert len(fake.requests) == 1
        assert request_texts(fake.requests[0]) == ["asked just before the crash"]
        assert roles(await bot.history()) == ["user", "assistant"]


async def test_a_quiet_sweeper_still_finds_work_a_dead_replica_left(
    tmp_path: Path, redis_url: str, redis_prefix: str, redis_client: aioredis.Redis
) -> None:
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        workers = bot.gateway.workers
        await wait_until(lambda: workers._quiet, timeout=10)  # nothing waits anywhere: sweeps slow down
        fake.script(Reply.text("found while quiet"))
        # Another replica took this message and died before answering: no kick reaches this one.
        await _leave_work_behind(redis_client, redis_prefix, "left by a replica that died")
        await bot.channel.wait_for(lambda ch: ch.texts("part"), timeout=15)
        await bot.wait_idle()
        assert bot.channel.texts("part") == ["found while quiet"]
        assert request_texts(fake.requests[0]) == ["left by a replica that died"]
        await bot.send("and a new message")  # a kick ends the quiet at once
        assert not workers._quiet
        await bot.channel.wait_for(lambda ch: len(ch.texts("part")) == 2, timeout=8)
        # Only the batch the dead replica left can have a preview of an earlier attempt.
        assert [resumed for _, resumed in bot.channel.opened] == [True, False]


async def test_retried_run_does_not_resend_a_delivered_part(
    tmp_path: Path, redis_url: str, redis_prefix: str, redis_client: aioredis.Redis
) -> None:
    run_id = await _leave_work_behind(redis_client, redis_prefix, "give me three parts")
    answer = "AAAAAAAAAABBBBBBBBBBCCCCC"
    ledger = DeliveryLedger(redis_client, redis_prefix)
    saved = RunResult(text=answer, messages=[Message.user("give me three parts"), Message.assistant(answer)])
    await ledger.save_result(run_id, saved)
    assert await ledger.claim(run_id, "0")
    await ledger.mark(run_id, "0", "sent:41")
    channel = RecordingChannel(part_limit=10)
    async with (
        FakeOpenAI() as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, channel=channel) as bot,
    ):
        await bot.channel.wait_for(lambda ch: len(ch.texts("part")) == 2, timeout=8)
        await bot.wait_idle()
        assert [(s.index, s.text) for s in channel.sent] == [(1, "BBBBBBBBBB"), (2, "CCCCC")]
        assert fake.requests == []  # the stored answer is reused, the model is not asked again
        states = await ledger.states(run_id)
        assert (
            states["0"] == "sent:41" and states["1"].startswith("sent:") and states["2"].startswith("sent:")
        )
        history = await bot.history()
        assert [(m.role, m.content) for m in history] == [
            ("user", "give me three parts"),
            ("assistant", answer),
        ]


async def test_shutdown_lets_a_short_run_finish(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with (
        FakeOpenAI() as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, gateway={"shutdown_grace_s": 5}) as bot,
    ):
        fake.script(Reply.text("finished in time", first_byte_delay_s=0.5))
        await bot.send("quick one")
        await fake.wait_for_requests(1)
        await bot.stop()
        assert bot.channel.texts("part") == ["finished in time"]
        assert fake.disconnects.count == 0
        async with aioredis.Redis.from_url(redis_url, decode_responses=True) as r:
            sk = dm_session()
            assert await r.exists(f"{redis_prefix}:inbox:{sk}", f"{redis_prefix}:running:{sk}") == 0
            assert await r.exists(f"{redis_prefix}:lock:{sk}") == 0


async def test_shutdown_cancels_a_long_run_and_leaves_it_for_retry(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    gate = Gate()
    async with FakeOpenAI(responder=gate) as fake:
        async with running_daemon(
            tmp_path, fake, redis_url, redis_prefix, gateway={"shutdown_grace_s": 0.5}
        ) as bot:
            await bot.send("a long job")
            await gate.wait_waiting(1)
            stopping = asyncio.create_task(bot.stop())
            await asyncio.wait_for(stopping, timeout=10)
            await gate.wait_hung_up(1)
            assert bot.channel.sent == []
            async with aioredis.Redis.from_url(redis_url, decode_responses=True) as r:
                sk = dm_session()
                waiting = await r.lrange(f"{redis_prefix}:running:{sk}", 0, -1)
                assert len(waiting) == 1 and "a long job" in waiting[0]
                assert await r.exists(f"{redis_prefix}:lock:{sk}") == 0  # released, not left to expire
                assert await r.llen(f"{redis_prefix}:session:{sk}:messages") == 0
        # The next replica to start picks it up and answers it.
        gate.release()
        async with running_daemon(tmp_path, fake, redis_url, redis_prefix, workspace="ws-next") as nxt:
            await nxt.channel.wait_for(lambda ch: ch.texts("part"), timeout=8)
            await nxt.wait_idle()
            assert nxt.channel.texts("part") == ["a long job"]
            assert roles(await nxt.history()) == ["user", "assistant"]
        await wait_until(lambda: gate.waiting == 0)


async def test_a_batch_that_keeps_failing_is_abandoned_with_a_notice(
    tmp_path: Path, redis_url: str, redis_prefix: str, redis_client: aioredis.Redis
) -> None:
    run_id = await _leave_work_behind(redis_client, redis_prefix, "the poison message")
    await redis_client.sadd(Keys(redis_prefix).resumes(run_id), "a", "b", "c")  # three replicas died on it already
    await Inbox(redis_client, redis_prefix).enqueue(chat_request("a later message"), 20)
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        fake.script(Reply.text("answer to the later message"))
        await bot.channel.wait_for(lambda ch: ch.texts("part"), timeout=8)
        await bot.wait_idle()
        [notice] = bot.channel.texts("notice")
        assert "could not process your message after several attempts" in notice
        assert bot.channel.texts("part") == ["answer to the later message"]
        assert len(fake.requests) == 1
        assert request_texts(fake.requests[0]) == ["a later message"]


async def test_a_resume_counted_again_after_a_lost_reply_counts_once(
    tmp_path: Path, redis_url: str, redis_prefix: str, redis_client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = await _leave_work_behind(redis_client, redis_prefix, "left by a replica that died")
    await redis_client.sadd(Keys(redis_prefix).resumes(run_id), "a", "b")  # two attempts so far: one more is allowed
    lost = LostReplies(monkeypatch, f":resumes:{run_id}", RETRIES)  # every try but the last loses its reply
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        fake.script(Reply.text("answered on the third attempt"))
        await bot.channel.wait_for(lambda ch: ch.sent, timeout=8)
        await bot.wait_idle()
        assert lost.lost == RETRIES
        assert bot.channel.texts("notice") == []
        assert bot.channel.texts("part") == ["answered on the third attempt"]
