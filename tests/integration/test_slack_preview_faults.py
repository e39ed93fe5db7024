"""Whatever Slack does to placeholders, the conversation ends with the answer once and
no partial copy: chat.update failures of every kind, unreadable answers, /stop, and a
run retried after a crash that finds its previous attempt's placeholder."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
import redis.asyncio as aioredis
from slack_sdk.web.async_client import AsyncWebClient

from channels.base import Target
from channels.preview_memory import PreviewBook
from channels.slack.api import SlackApi, SlackCallError
from channels.slack.format import preview_part
from channels.slack.stream import FIRST_PREVIEW_DELAY_S, SlackReplyStream
from tests.fakes.slack_server import CHAOS_KINDS, FakeSlack
from tests.fakes.store_requests import StoreRequests
from tests.fakes.telegram_context import RedisKV

pytestmark = pytest.mark.timeout(60)

TARGET = Target(channel="slack", chat_id="C1", thread_id="100.1", reply_to="100.1")


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


@pytest.fixture
async def api(fake: FakeSlack) -> AsyncIterator[SlackApi]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as session:
        client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url, session=session, retry_handlers=[])
        yield SlackApi(client, backoff_s=0.05, max_retry_after_s=0.2)


@pytest.fixture
def kv(redis_client: aioredis.Redis, redis_prefix: str) -> RedisKV:
    return RedisKV(redis_client, redis_prefix)


def open_stream(
    api: SlackApi, kv: RedisKV, run_id: str, *, book: PreviewBook | None = None, resumed: bool = True,
    interval_s: float = 0.2, first_preview_delay_s: float = FIRST_PREVIEW_DELAY_S,
) -> SlackReplyStream:
    """A stream as the channel opens it; without ``book`` one of its own (as if on another replica)."""
    memory = (book or PreviewBook(kv, "slack")).memory(run_id, TARGET.chat_id, resumed=resumed)
    return SlackReplyStream(api, TARGET, run_id, format_preview=preview_part, interval_s=interval_s,
                            first_preview_delay_s=first_preview_delay_s, memory=memory)


def conversation(fake: FakeSlack) -> list[str]:
    """What the thread shows now, oldest first."""
    return [m["text"] for (channel, _), m in sorted(fake.messages.items(), key=lambda kv: float(kv[0][1]))
            if channel == "C1"]


async def stream_a_reply(api: SlackApi, kv: RedisKV, run_id: str, drafts: int = 5) -> None:
    stream = open_stream(api, kv, run_id)
    await stream.start()
    text = "draft"
    for n in range(drafts):
        text += f" w{n}"
        await stream.preview(text)
        await asyncio.sleep(0.25)
    await stream.deliver(0, "Final answer")
    await stream.deliver(1, "second part")
    await stream.close()


@pytest.mark.parametrize("kind", CHAOS_KINDS)
async def test_every_kind_of_update_failure_still_ends_with_the_answer_once(
    fake: FakeSlack, api: SlackApi, kv: RedisKV, kind: str
) -> None:
    fake.chaos("chat.update", 1.0, kinds=(kind,), hang_s=1.0)
    await stream_a_reply(api, kv, f"run-{kind}")
    assert conversation(fake) == ["Final answer", "second part"]
    assert len(fake.calls_to("chat.postMessage")) <= 3  # one placeholder at most, never one per update


@pytest.mark.parametrize("kind", ["malformed", "drop", "500"])
async def test_a_failed_placeholder_post_does_not_break_the_run(
    fake: FakeSlack, api: SlackApi, kv: RedisKV, kind: str
) -> None:
    fake.chaos("chat.postMessage", 1.0, kinds=(kind,))
    stream = open_stream(api, kv, f"run-post-{kind}")
    await stream.preview("draft")
    await fake.wait_calls("chat.postMessage")
    await asyncio.sleep(0.3)
    fake.calm()
    await stream.preview("draft two")
    await stream.deliver(0, "Final answer")
    await stream.close()
    assert conversation(fake) == ["Final answer"]


async def test_an_answer_without_ts_counts_as_posted_once(fake: FakeSlack, api: SlackApi, kv: RedisKV) -> None:
    stream = open_stream(api, kv, "run-no-ts")
    fake.malformed("chat.postMessage", {"ok": True})
    assert await stream.deliver(0, "Final answer") == ""
    assert len(fake.calls_to("chat.postMessage")) == 1  # not posted again


@pytest.mark.parametrize("kind", ["malformed", "message_not_found", "drop"])
async def test_stop_after_a_failed_update_deletes_the_placeholder(
    fake: FakeSlack, api: SlackApi, kv: RedisKV, kind: str
) -> None:
    stream = open_stream(api, kv, f"run-stop-{kind}")
    await stream.preview("draft one")
    await fake.wait_calls("chat.postMessage")
    await asyncio.sleep(0.3)
    fake.chaos("chat.update", 1.0, kinds=(kind,))
    await stream.preview("draft one two")
    await fake.wait_calls("chat.update")
    await asyncio.sleep(0.2)
    await stream.discard()
    await stream.close()
    assert conversation(fake) == []


async def leave_a_placeholder(fake: FakeSlack, api: SlackApi, kv: RedisKV, run_id: str) -> None:
    """An attempt shows a placeholder, stores its ts and dies (nothing closed or deleted)."""
    stream = open_stream(api, kv, run_id)
    await stream.preview("half of the ans")
    await fake.wait_calls("chat.postMessage")
    await asyncio.sleep(0.3)


async def test_a_retried_run_finalizes_the_placeholder_of_the_attempt_that_died(
    fake: FakeSlack, api: SlackApi, kv: RedisKV
) -> None:
    await leave_a_placeholder(fake, api, kv, "run-crash")  # another attempt of the same run goes on
    retried = open_stream(api, kv, "run-crash")
    await retried.preview("half of the answer again")
    await asyncio.sleep(0.4)
    await retried.deliver(0, "The whole answer")
    await retried.close()
    assert conversation(fake) == ["The whole answer"]
    assert len(fake.calls_to("chat.postMessage")) == 1


async def test_a_retried_run_that_ends_silent_deletes_the_dead_attempts_placeholder(
    fake: FakeSlack, api: SlackApi, kv: RedisKV
) -> None:
    await leave_a_placeholder(fake, api, kv, "run-crash-2")
    retried = open_stream(api, kv, "run-crash-2")
    await retried.discard()
    await retried.close()
    assert conversation(fake) == []


async def test_a_first_attempt_never_looks_for_a_placeholder_left_behind(
    fake: FakeSlack, api: SlackApi, kv: RedisKV, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = StoreRequests(monkeypatch)
    stream = open_stream(api, kv, "run-first", resumed=False)
    await stream.preview("draft one")
    await fake.wait_calls("chat.postMessage")
    await asyncio.sleep(0.3)  # the placeholder's ts is stored while the answer is still being written
    await stream.deliver(0, "Final answer")
    await stream.close()
    assert conversation(fake) == ["Final answer"]
    assert requests.commands(":preview:run-first") == ["SET", "DEL"]  # stored and cleared, never looked up


async def test_a_placeholder_the_waiting_answer_settles_at_once_is_not_recorded(
    fake: FakeSlack, api: SlackApi, kv: RedisKV, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = StoreRequests(monkeypatch)
    fake.hang("chat.postMessage", 0.3)
    stream = open_stream(api, kv, "run-quick", resumed=False)
    await stream.preview("Final")
    await fake.wait_calls("chat.postMessage")  # the placeholder is on its way...
    await stream.deliver(0, "Final answer")  # ...when the whole answer is there
    await stream.close()
    assert conversation(fake) == ["Final answer"]
    assert len(fake.calls_to("chat.postMessage")) == 1  # the placeholder became the answer
    assert requests.touching(":preview:") == []


async def test_a_placeholder_that_outlives_a_failed_delivery_is_recorded_for_the_redelivery(
    fake: FakeSlack, api: SlackApi, kv: RedisKV
) -> None:
    fake.hang("chat.postMessage", 0.3)
    stream = open_stream(api, kv, "run-outlives", resumed=False)
    await stream.preview("Final")
    await fake.wait_calls("chat.postMessage")
    for method in ("chat.update", "chat.postMessage", "chat.delete"):  # Slack is down from here on
        fake.chaos(method, 1.0, kinds=("500",))
    with pytest.raises(SlackCallError):
        await stream.deliver(0, "Final answer")
    await stream.close()
    fake.calm()
    assert conversation(fake) == ["Final"]  # the placeholder is still there
    redelivered = open_stream(api, kv, "run-outlives")  # what a redelivery opens, later
    await redelivered.deliver(0, "Final answer")
    await redelivered.close()
    assert conversation(fake) == ["Final answer"]


async def test_a_restart_after_a_resumed_pass_that_never_looked_still_takes_over_the_dead_placeholder(
    fake: FakeSlack, api: SlackApi, kv: RedisKV
) -> None:
    await leave_a_placeholder(fake, api, kv, "run-fold")
    book = PreviewBook(kv, "slack")
    open_stream(api, kv, "run-fold", book=book, resumed=True)  # resumed; more messages came before it looked
    folded = open_stream(api, kv, "run-fold", book=book, resumed=False)  # the restart with them
    await folded.deliver(0, "The whole answer")
    await folded.close()
    assert conversation(fake) == ["The whole answer"]
    assert len(fake.calls_to("chat.postMessage")) == 1


async def test_failing_reactions_never_cost_the_reply(fake: FakeSlack, api: SlackApi, kv: RedisKV) -> None:
    fake.chaos("reactions.add", 1.0, hang_s=1.0)
    fake.chaos("reactions.remove", 1.0, hang_s=1.0)
    await stream_a_reply(api, kv, "run-no-reactions")
    assert conversation(fake) == ["Final answer", "second part"]
    assert fake.calls_to("reactions.add")


async def test_an_answer_done_before_the_first_preview_is_due_is_posted_once(
    fake: FakeSlack, api: SlackApi, kv: RedisKV, redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    stream = open_stream(api, kv, "run-fast", interval_s=1.0, first_preview_delay_s=0.5)
    await stream.start()
    for text in ("Quick", "Quick answer"):
        await stream.preview(text)
    await stream.deliver(0, "Quick answer.")
    await stream.close()
    assert conversation(fake) == ["Quick answer."]
    assert len(fake.calls_to("chat.postMessage")) == 1 and not fake.calls_to("chat.update")
    assert await redis_client.keys(f"{redis_prefix}:*preview*") == []  # nothing to remember


async def test_a_slower_answer_gets_its_placeholder_after_the_first_delay(fake: FakeSlack, api: SlackApi, kv: RedisKV) -> None:
    stream = open_stream(api, kv, "run-slow", interval_s=1.0, first_preview_delay_s=0.1)
    await stream.preview("Thinking about it")
    await fake.wait_calls("chat.postMessage", 1, within=2.0)
    await stream.deliver(0, "The answer.")
    await stream.close()
    assert conversation(fake) == ["The answer."]  # the placeholder became the answer
    assert len(fake.calls_to("chat.postMessage")) == 1 and len(fake.calls_to("chat.update")) == 1
