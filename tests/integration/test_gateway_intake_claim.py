"""A message for a session nobody serves is queued, its session's lock taken and its batch
claimed in one round trip (``Inbox.enqueue_and_claim``), and its worker starts on that
claim; against the fake OpenAI server and a real Redis.

Whatever the claim cannot be taken for (the lock held elsewhere, every run slot busy,
interrupt mode) falls back to the queue, which the lock's holder or the next free slot
serves, so no message waits for a sweep or is run twice."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.store.locks import Lease
from bot.store.owned import ACQUIRE
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.store_requests import StoreRequests
from tests.integration.gateway_harness import (
    Gate,
    chat_request,
    dm_session,
    roles,
    running_daemon,
    wait_until,
)


async def test_a_lone_message_is_queued_and_claimed_in_one_round_trip(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.script(Reply.text("hello back"))
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        requests = StoreRequests(monkeypatch)
        assert (await bot.send("hello")).status == "queued"
        await bot.wait_idle()
        session = dm_session()
        lock = bot.keys.lock(session)
        # The lock taken, the message queued, the batch claimed, and the run's first read
        # (history, summary, meta, the stop key): one request.
        intake = requests.touching(bot.keys.inbox(session))[0]
        assert lock.encode() in intake and b"hello" in intake
        assert bot.keys.session_messages(session).encode() in intake
        assert requests.commands(bot.keys.inbox(session))[0] == "EVAL+EVAL+EVAL+GET+LRANGE+GET+HGETALL"
        # The lock is taken there and nowhere else (the worker does not try again).
        assert [r for r in requests.sent if ACQUIRE.encode() in r] == [intake]
        assert bot.channel.texts("part") == ["hello back"]
        assert roles(await bot.history()) == ["user", "assistant"]


async def test_a_session_locked_elsewhere_keeps_its_message_for_the_holder(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str
) -> None:
    fake.script(Reply.text("answered after the other holder"))
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        other = Lease(bot.redis, bot.keys.lock(dm_session()), ttl_s=30, owner="other-replica", auto_renew=False)
        assert await other.acquire(wait=False)
        assert (await bot.send("waiting for the lock")).status == "queued"
        await asyncio.sleep(0.3)
        assert await bot.queued() == (1, 0)  # queued, not claimed, not run
        assert fake.requests == []
        await other.release()
        bot.gateway.kick(dm_session())  # what the holder's finish would do (or a sweep)
        await bot.wait_idle()
        assert bot.channel.texts("part") == ["answered after the other holder"]
        assert len(fake.requests) == 1


async def test_a_duplicate_hands_its_taken_lock_back(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str
) -> None:
    fake.script(Reply.text("once"))
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        assert (await bot.send("hello", dedupe_key="update:7")).status == "queued"
        await bot.wait_idle()
        # The redelivery takes the free lock with its (refused) message: the worker started
        # on that claim finds nothing to run and lets the lock go.
        assert (await bot.send("hello", dedupe_key="update:7")).status == "duplicate"
        await bot.wait_idle()
        assert bot.channel.texts("part") == ["once"]
        assert len(fake.requests) == 1
        assert not await bot.redis.exists(bot.keys.lock(dm_session()))


async def test_with_every_run_slot_busy_a_message_is_only_queued(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(Reply.text("first"), Reply.text("second"))
    fake.responder = gate
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix, gateway={"max_concurrent_runs": 1}) as bot:
        await bot.send("one", chat_id="1")
        await gate.wait_waiting()
        requests = StoreRequests(monkeypatch)
        await bot.send("two", chat_id="2")
        queued = requests.touching(bot.keys.inbox(dm_session("2")))
        assert len(queued) == 1 and bot.keys.lock(dm_session("2")).encode() not in queued[0]
        assert await bot.queued("2") == (1, 0)
        gate.release(2)
        await bot.wait_idle("1")
        await bot.wait_idle("2")
        assert sorted(bot.channel.texts("part")) == ["first", "second"]


async def test_a_burst_beyond_the_run_slots_takes_no_lock_it_would_wait_with(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate()
    fake.responder = gate
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix, gateway={"max_concurrent_runs": 2}) as bot:
        requests = StoreRequests(monkeypatch)
        chats = [str(n) for n in range(1, 7)]
        results = await asyncio.gather(*(bot.send(f"hello from {chat}", chat_id=chat) for chat in chats))
        assert {r.status for r in results} == {"queued"}
        # Sent at once, before any worker started: only as many took their lock as there are slots.
        assert len([r for r in requests.sent if ACQUIRE.encode() in r]) == 2
        await gate.wait_waiting(2)
        gate.release(len(chats))
        for chat in chats:
            await bot.wait_idle(chat)
        assert sorted(bot.channel.texts("part")) == sorted(f"hello from {chat}" for chat in chats)
        assert not bot.gateway.workers._claiming and not bot.gateway.workers._slots.contended


async def test_a_worker_kicked_while_a_claim_is_in_flight_waits_behind_it(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str
) -> None:
    # The replies of a burst's claims and queued messages can come back in any order: a
    # worker kicked for a queued message before a claim is back must not take the claim's
    # slot (and then its session's lock, while the claim's worker waits holding its own).
    gate = Gate(Reply.text("to the claim"), Reply.text("to the queued"))
    fake.responder = gate
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix, gateway={"max_concurrent_runs": 1}) as bot:
        workers, claimed, queued = bot.gateway.workers, dm_session("1"), dm_session("2")
        lock = workers.claim_lock(claimed)
        assert lock is not None
        await bot.gateway.inbox.enqueue(chat_request("queued", chat_id="2"), 20)
        workers.kick(queued)
        await asyncio.sleep(0.3)
        assert not await bot.redis.exists(bot.keys.lock(queued))  # waiting for the slot, without its lock
        assert workers.claim_lock(dm_session("3")) is None  # the one slot is the claim's
        _, claim = await bot.gateway.inbox.enqueue_and_claim(chat_request("claimed", chat_id="1"), 20, lock)
        workers.claim_returned(claimed, lock, claim)
        await gate.wait_waiting()
        assert gate.waiting == 1 and not await bot.redis.exists(bot.keys.lock(queued))
        gate.release(2)
        await bot.wait_idle("1")
        await bot.wait_idle("2")
        assert bot.channel.texts("part") == ["to the claim", "to the queued"]
        assert not workers._claiming and not workers._slots.contended


async def test_a_busy_chat_gives_its_slot_to_a_waiting_one_between_batches(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str
) -> None:
    gate = Gate()  # echoes each batch's last message
    fake.responder = gate
    config = {"gateway": {"max_concurrent_runs": 1}, "queue": {"mode": "followup"}}
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix, **config) as bot:
        await bot.send("busy one", chat_id="1")
        await gate.wait_waiting()
        await bot.send("busy two", chat_id="1")  # for the busy chat's worker, after its batch
        await bot.send("waiting", chat_id="2")  # kicked: waits for the one slot
        await wait_until(lambda: bot.gateway.workers._slots.contended, what="the second chat to wait")
        gate.release(3)
        await bot.wait_idle("1")
        await bot.wait_idle("2")
        assert bot.channel.texts("part") == ["busy one", "waiting", "busy two"]


async def test_interrupt_mode_queues_without_taking_the_lock(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.script(Reply.text("not interrupted by itself"))
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix, queue={"mode": "interrupt"}) as bot:
        requests = StoreRequests(monkeypatch)
        await bot.send("hello")
        await bot.wait_idle()
        intake = requests.touching(bot.keys.inbox(dm_session()))[0]
        assert bot.keys.lock(dm_session()).encode() not in intake
        assert bot.channel.texts("part") == ["not interrupted by itself"]


async def test_messages_in_a_row_are_served_by_the_worker_of_the_first(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str
) -> None:
    gate = Gate(Reply.text("to the first"), Reply.text("to the rest"))
    fake.responder = gate
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix, queue={"mode": "followup"}) as bot:
        await bot.send("first")
        await gate.wait_waiting()
        # The session has its worker here: these are queued for it, not claimed anew.
        await bot.send("second")
        await bot.send("third")
        assert len(bot.gateway.workers.tasks) == 1
        gate.release(2)
        await bot.wait_idle()
        await wait_until(lambda: len(bot.channel.texts("part")) == 2, what="both answers")
        assert bot.channel.texts("part") == ["to the first", "to the rest"]
        assert len(fake.requests) == 2


async def test_a_claim_handed_over_while_closing_is_left_for_a_resume(
    tmp_path: Path, fake: FakeOpenAI, redis_url: str, redis_prefix: str
) -> None:
    async with running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        session = dm_session()
        lock = bot.gateway.workers.claim_lock(session)
        assert lock is not None
        enqueued, claim = await bot.gateway.inbox.enqueue_and_claim(chat_request("late"), 20, lock)
        assert claim is not None and [r.text for r in claim.batch] == ["late"] and not enqueued.duplicate
        bot.gateway.workers._closing = True
        bot.gateway.workers.claim_returned(session, lock, claim)
        await wait_until(lambda: session not in bot.gateway.workers.tasks, what="the worker to let go")
        assert not await bot.redis.exists(bot.keys.lock(session))  # released, not kept renewing
        assert await bot.queued() == (0, 1)  # still running: the next holder resumes it
        assert fake.requests == []
