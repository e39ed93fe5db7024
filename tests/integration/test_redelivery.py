"""A reply part that still fails after its immediate retries is delivered later, once;
after the bounded window it is given up, counted, and the chat told once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from agent.types import TelegramChat
from bot import metrics
from bot.gateway.redelivery import UNDELIVERED_TEXT, Redelivery
from bot.gateway.reply import DeliveryLedger, Reply
from bot.store.keys import Keys
from channels.base import Target
from channels.telegram.adapter import TelegramChannel
from tests.fakes.lost_replies import LostReplies
from tests.fakes.telegram_context import TelegramHarness

pytestmark = pytest.mark.timeout(60)

DM = Target(channel="telegram", chat_id="42", reply_to="7", chat=TelegramChat(chat_type="private"))
SEND_ATTEMPTS = 2  # immediate tries of one send


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def h(redis_client: aioredis.Redis, redis_prefix: str) -> AsyncIterator[TelegramHarness]:
    async with TelegramHarness(redis_client, redis_prefix) as harness:
        yield harness


@pytest.fixture
async def ch(h: TelegramHarness) -> TelegramChannel:
    return await h.channel(tuning={"send_attempts": SEND_ATTEMPTS})


@pytest.fixture
def ledger(redis_client: aioredis.Redis, redis_prefix: str) -> DeliveryLedger:
    return DeliveryLedger(redis_client, redis_prefix)


def redelivery(redis_client: aioredis.Redis, prefix: str, ch: TelegramChannel, ledger: DeliveryLedger,
               clock: Clock) -> Redelivery:
    """One replica's worker (a new one stands for a restarted or another replica)."""
    return Redelivery(redis_client, Keys(prefix), {"telegram": ch}, ledger, max_age_s=60, first_delay_s=5,
                      max_delay_s=20, clock=clock)


def texts(h: TelegramHarness) -> list[str]:
    return [m.text for m in h.fake.sent_messages(42)]


async def fail_a_reply(
    h: TelegramHarness, ch: TelegramChannel, ledger: DeliveryLedger, worker: Redelivery, run_id: str, *,
    failing_sends: int = SEND_ATTEMPTS, code: int = 500, description: str = "Internal Server Error",
) -> None:
    """A reply whose immediate tries fail (``failing_sends`` sends in all fail), so its part
    goes to ``worker``."""
    h.fake.fail_next("sendMessage", code=code, description=description, times=failing_sends)
    reply = Reply(ch, DM, run_id, ledger, kind="chat", previews=False, redelivery=worker)
    assert await reply.finish("The answer") == "failed"


async def test_a_failed_part_is_delivered_later_once_by_whichever_replica_is_up(
    h: TelegramHarness, ch: TelegramChannel, ledger: DeliveryLedger, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    clock = Clock()
    first = redelivery(redis_client, redis_prefix, ch, ledger, clock)
    await fail_a_reply(h, ch, ledger, first, "run-later")
    assert texts(h) == []
    assert await first.run_due() == 0  # not due yet
    assert (await ledger.states("run-later"))["0"].startswith("failed:")

    # The replica that failed is gone; two others race for the due part.
    clock.now += 6
    a = redelivery(redis_client, redis_prefix, ch, ledger, clock)
    b = redelivery(redis_client, redis_prefix, ch, ledger, clock)
    handled = await asyncio.gather(a.run_due(), b.run_due())
    assert sorted(handled) == [0, 1]
    assert texts(h) == ["The answer"]
    assert (await ledger.states("run-later"))["0"].startswith("sent:")
    clock.now += 600
    assert await a.run_due() == 0 and await a.pending() == 0
    assert texts(h) == ["The answer"]


async def test_a_claim_sent_again_after_its_reply_was_lost_is_still_this_replicas(
    h: TelegramHarness, ch: TelegramChannel, ledger: DeliveryLedger, store_client: aioredis.Redis,
    redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Read as another replica's lease, the part would wait out the lease (3 minutes).
    clock = Clock()
    worker = redelivery(store_client, redis_prefix, ch, ledger, clock)
    await fail_a_reply(h, ch, ledger, worker, "run-claim-lost")
    clock.now += 6
    lost = LostReplies(monkeypatch, "redelivery", 1, commands=("EVAL",))
    assert await worker.run_due() == 1
    assert lost.lost == 1
    assert texts(h) == ["The answer"]
    assert await worker.pending() == 0
    assert not await store_client.exists(Keys(redis_prefix).redelivery_claims())


async def test_a_part_failing_for_the_whole_window_is_given_up_counted_and_the_chat_told_once(
    h: TelegramHarness, ch: TelegramChannel, ledger: DeliveryLedger, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    clock = Clock()
    worker = redelivery(redis_client, redis_prefix, ch, ledger, clock)
    given_up = metrics.DELIVERIES.labels("telegram", "given_up")._value.get()
    # The reply, then the retries at +30 s and +60 s (the end of the window) fail; the
    # platform is back just in time for the notice.
    await fail_a_reply(h, ch, ledger, worker, "run-lost", failing_sends=3 * SEND_ATTEMPTS, code=502,
                       description="Bad Gateway")
    attempts = 0
    while await worker.pending():
        clock.now += 30
        attempts += await worker.run_due()
        assert attempts < 20, "the retries are not bounded"
    assert attempts == 2
    assert (await ledger.states("run-lost"))["0"].startswith("given_up:")
    assert metrics.DELIVERIES.labels("telegram", "given_up")._value.get() == given_up + 1
    assert texts(h) == [UNDELIVERED_TEXT]
    clock.now += 3600
    assert await worker.run_due() == 0
    assert texts(h) == [UNDELIVERED_TEXT]


async def test_a_part_whose_sender_died_mid_send_is_never_sent_again(
    h: TelegramHarness, ch: TelegramChannel, ledger: DeliveryLedger, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    clock = Clock()
    worker = redelivery(redis_client, redis_prefix, ch, ledger, clock)
    await fail_a_reply(h, ch, ledger, worker, "run-died")
    await ledger.mark("run-died", "0", "resending")  # a worker claimed it and was SIGKILLed while sending
    clock.now += 600
    assert await worker.run_due() == 1
    assert await worker.pending() == 0
    sends = [c for c in h.fake.calls_to("sendMessage") if "The answer" in str(c.params.get("text"))]
    assert len(sends) == SEND_ATTEMPTS  # only the first, failed, tries


async def test_a_part_whose_answer_was_lost_is_recorded_unknown_and_never_sent_again(
    h: TelegramHarness, ch: TelegramChannel, ledger: DeliveryLedger, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    clock = Clock()
    worker = redelivery(redis_client, redis_prefix, ch, ledger, clock)
    unknown = metrics.DELIVERIES.labels("telegram", "unknown")._value.get()
    h.fake.drop_next("sendMessage", after_effect=True)  # made, and the answer lost on the way
    reply = Reply(ch, DM, "run-answer-lost", ledger, kind="chat", previews=False, redelivery=worker)
    assert await reply.finish("The answer") == "unknown"
    assert (await ledger.states("run-answer-lost"))["0"] == "unknown"
    assert metrics.DELIVERIES.labels("telegram", "unknown")._value.get() == unknown + 1
    assert await worker.pending() == 0  # not deferred: a later send would show it twice
    clock.now += 3600
    assert await worker.run_due() == 0
    assert texts(h) == ["The answer"]


async def test_a_redelivery_whose_answer_was_lost_is_given_up_unknown(
    h: TelegramHarness, ch: TelegramChannel, ledger: DeliveryLedger, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    clock = Clock()
    worker = redelivery(redis_client, redis_prefix, ch, ledger, clock)
    await fail_a_reply(h, ch, ledger, worker, "run-retry-lost")
    h.fake.drop_next("sendMessage", after_effect=True)
    clock.now += 6
    assert await worker.run_due() == 1
    assert await worker.pending() == 0
    assert (await ledger.states("run-retry-lost"))["0"] == "unknown"
    clock.now += 3600
    assert await worker.run_due() == 0
    assert texts(h) == ["The answer"]


async def eventually_sent(h: TelegramHarness, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while texts(h) != ["The answer"]:
        assert asyncio.get_running_loop().time() < deadline, f"not redelivered: {texts(h)}"
        await asyncio.sleep(0.02)


async def test_an_idle_worker_waits_long_yet_takes_a_part_deferred_here_at_once(
    h: TelegramHarness, ch: TelegramChannel, ledger: DeliveryLedger, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    worker = Redelivery(redis_client, Keys(redis_prefix), {"telegram": ch}, ledger, first_delay_s=0, poll_s=0.05,
                        quiet_poll_s=120)
    worker.start()
    try:
        while not worker._queue_empty:  # its first look found nothing: the long wait begins
            await asyncio.sleep(0.01)
        await fail_a_reply(h, ch, ledger, worker, "run-woken")
        await eventually_sent(h)  # long before the 120 s wait would have ended
    finally:
        await worker.stop()


async def test_an_idle_worker_still_takes_over_a_part_another_replica_left(
    h: TelegramHarness, ch: TelegramChannel, ledger: DeliveryLedger, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    keys = Keys(redis_prefix)
    idle = Redelivery(redis_client, keys, {"telegram": ch}, ledger, first_delay_s=0, poll_s=0.05, quiet_poll_s=0.2)
    idle.start()
    try:
        while not idle._queue_empty:
            await asyncio.sleep(0.01)
        gone = Redelivery(redis_client, keys, {"telegram": ch}, ledger, first_delay_s=0)  # never started: it died
        await fail_a_reply(h, ch, ledger, gone, "run-orphan")
        await eventually_sent(h)
    finally:
        await idle.stop()
