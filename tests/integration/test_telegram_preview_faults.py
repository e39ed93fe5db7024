"""Whatever the Bot API does to previews, the chat ends with the final answer once and
no partial copy: edit failures of every kind, unreadable answers, /stop, and a run
retried after a crash that finds its previous attempt's preview."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from agent.types import TelegramChat
from channels.base import Target
from channels.telegram.adapter import TelegramChannel
from tests.fakes.store_requests import StoreRequests
from tests.fakes.telegram_context import TelegramHarness
from tests.fakes.telegram_server import CHAOS_KINDS

pytestmark = pytest.mark.timeout(60)

DM = Target(channel="telegram", chat_id="42", reply_to="7", chat=TelegramChat(chat_type="private"))
TUNING = {"preview_timeout_s": 0.5, "send_backoff_s": 0.05}


@pytest.fixture
async def h(redis_client: aioredis.Redis, redis_prefix: str) -> AsyncIterator[TelegramHarness]:
    async with TelegramHarness(redis_client, redis_prefix) as harness:
        yield harness


@pytest.fixture
async def ch(h: TelegramHarness) -> TelegramChannel:
    return await h.channel(tuning=TUNING)


def chat_texts(h: TelegramHarness) -> list[str]:
    return [m.text for m in h.fake.sent_messages(42)]


async def stream_a_reply(h: TelegramHarness, ch: TelegramChannel, run_id: str, drafts: int = 6) -> None:
    """Preview a growing text, then deliver a two-part final answer."""
    stream = ch.open_stream(DM, run_id)
    await stream.start()
    text = "draft"
    for n in range(drafts):
        text += f" w{n}"
        await stream.preview(text)
        await asyncio.sleep(0.35)  # past the harness's edit interval: every draft is pushed
    await stream.deliver(0, "Final answer")
    await stream.deliver(1, "second part")
    await stream.close()


@pytest.mark.parametrize("kind", CHAOS_KINDS)
async def test_every_kind_of_edit_failure_still_ends_with_the_answer_once(
    h: TelegramHarness, ch: TelegramChannel, kind: str
) -> None:
    h.fake.chaos("editMessageText", 1.0, kinds=(kind,), hang_s=1.5)
    await stream_a_reply(h, ch, f"run-{kind}")
    assert chat_texts(h) == ["Final answer", "second part"]
    assert len(h.fake.sent_messages(42, include_deleted=True)) <= 3  # one preview at most, never one per edit


@pytest.mark.parametrize("kind", CHAOS_KINDS)
async def test_a_single_failed_edit_ends_previews_and_the_answer_replaces_them(
    h: TelegramHarness, ch: TelegramChannel, kind: str
) -> None:
    original = h.fake._take_fault

    def fail_second_edit(method: str):  # type: ignore[no-untyped-def]
        if method == "editMessageText" and len(h.fake.calls_to(method)) == 2:
            h.fake.chaos(method, 1.0, kinds=(kind,), hang_s=1.5)
            fault = original(method)
            h.fake.calm(method)
            return fault
        return original(method)

    h.fake._take_fault = fail_second_edit  # type: ignore[method-assign]
    await stream_a_reply(h, ch, f"run1-{kind}")
    assert chat_texts(h) == ["Final answer", "second part"]


async def test_unreadable_answer_to_the_first_preview_does_not_break_the_run(
    h: TelegramHarness, ch: TelegramChannel
) -> None:
    h.fake.malformed_next("sendMessage")
    await stream_a_reply(h, ch, "run-malformed-send")
    assert chat_texts(h) == ["Final answer", "second part"]


async def test_a_preview_the_user_deleted_is_replaced_by_the_answer(h: TelegramHarness, ch: TelegramChannel) -> None:
    stream = ch.open_stream(DM, "run-deleted")
    await stream.preview("draft one")
    await h.fake.wait_calls("sendMessage")
    [preview] = h.fake.sent_messages(42)
    preview.deleted = True  # the user deleted it
    await stream.preview("draft one two")
    await asyncio.sleep(0.5)
    await stream.deliver(0, "Final answer")
    await stream.close()
    assert chat_texts(h) == ["Final answer"]


@pytest.mark.parametrize("kind", ["malformed", "500", "drop"])
async def test_stop_after_a_failed_edit_deletes_the_preview(h: TelegramHarness, ch: TelegramChannel, kind: str) -> None:
    stream = ch.open_stream(DM, f"run-stop-{kind}")
    await stream.start()
    await stream.preview("draft one")
    await h.fake.wait_calls("sendMessage")
    h.fake.chaos("editMessageText", 1.0, kinds=(kind,))
    await stream.preview("draft one two")
    await h.fake.wait_calls("editMessageText")
    await asyncio.sleep(0.3)
    await stream.discard()  # what /stop does
    await stream.close()
    assert chat_texts(h) == []


async def test_a_retried_run_finalizes_the_preview_of_the_attempt_that_died(
    h: TelegramHarness, ch: TelegramChannel
) -> None:
    first = ch.open_stream(DM, "run-crash")
    await first.preview("half of the ans")
    await h.fake.wait_calls("sendMessage")
    await asyncio.sleep(0.3)  # the attempt stored its preview id
    # The replica dies here: nothing is closed or deleted. Another attempt runs.
    retried = (await h.channel(replica_id="replica-b", tuning=TUNING)).open_stream(DM, "run-crash", resumed=True)
    await retried.preview("half of the answer again")
    await asyncio.sleep(0.5)
    await retried.deliver(0, "The whole answer")
    await retried.close()
    assert chat_texts(h) == ["The whole answer"]
    assert len(h.fake.sent_messages(42, include_deleted=True)) == 1


async def test_a_retried_run_that_ends_silent_deletes_the_dead_attempts_preview(
    h: TelegramHarness, ch: TelegramChannel
) -> None:
    first = ch.open_stream(DM, "run-crash-2")
    await first.preview("half of the ans")
    await h.fake.wait_calls("sendMessage")
    await asyncio.sleep(0.3)  # the attempt stored its preview id
    retried = ch.open_stream(DM, "run-crash-2")
    await retried.discard()
    await retried.close()
    assert chat_texts(h) == []


async def test_a_first_attempt_never_looks_for_a_preview_left_behind(
    h: TelegramHarness, ch: TelegramChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = StoreRequests(monkeypatch)
    stream = ch.open_stream(DM, "run-first", resumed=False)
    await stream.preview("draft one")
    await h.fake.wait_calls("sendMessage")
    await asyncio.sleep(0.3)  # the preview id is stored
    await stream.deliver(0, "Final answer")
    await stream.close()
    assert chat_texts(h) == ["Final answer"]
    assert requests.commands(":preview:run-first") == ["SET", "DEL"]  # stored and cleared, never looked up
    requests.reset()
    quick = ch.open_stream(DM, "run-quick", resumed=False)  # answered before any preview was due
    await quick.deliver(0, "Short")
    await quick.close()
    assert requests.touching(":preview:") == []


async def test_a_restart_after_a_resumed_pass_that_never_looked_still_takes_over_the_dead_preview(
    h: TelegramHarness, ch: TelegramChannel
) -> None:
    dead = (await h.channel(replica_id="replica-b", tuning=TUNING)).open_stream(DM, "run-fold")
    await dead.preview("half of the ans")
    await h.fake.wait_calls("sendMessage")
    await asyncio.sleep(0.3)  # the attempt stored its preview id; then its replica died
    ch.open_stream(DM, "run-fold", resumed=True)  # resumed here; more messages came before it looked
    folded = ch.open_stream(DM, "run-fold", resumed=False)  # the restart with them
    await folded.deliver(0, "The whole answer")
    await folded.close()
    assert chat_texts(h) == ["The whole answer"]
    assert len(h.fake.sent_messages(42, include_deleted=True)) == 1  # the dead preview became the answer


async def test_a_restart_takes_over_the_preview_its_cancelled_pass_could_not_delete(
    h: TelegramHarness, ch: TelegramChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = ch.open_stream(DM, "run-restart", resumed=False)
    await first.preview("half of the ans")
    await h.fake.wait_calls("sendMessage")
    await asyncio.sleep(0.3)
    h.fake.chaos("deleteMessage", 1.0, kinds=("500",))
    await first.discard()  # the pass is cancelled; its preview stays
    await first.close()
    h.fake.calm("deleteMessage")
    requests = StoreRequests(monkeypatch)
    again = ch.open_stream(DM, "run-restart", resumed=False)
    await again.deliver(0, "The whole answer")
    await again.close()
    assert chat_texts(h) == ["The whole answer"]
    assert len(h.fake.sent_messages(42, include_deleted=True)) == 1
    assert requests.commands(":preview:run-restart") == ["DEL"]  # known in process: no lookup


async def test_failing_optional_calls_never_cost_the_reply(h: TelegramHarness, ch: TelegramChannel) -> None:
    h.fake.chaos("sendChatAction", 1.0, hang_s=1.0)
    await stream_a_reply(h, ch, "run-no-typing")
    assert chat_texts(h) == ["Final answer", "second part"]
    assert h.fake.calls_to("sendChatAction")
