"""SlackReplyStream against the fake Slack: reaction, throttled preview, finalize, discard."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import aiohttp
import pytest
from slack_sdk.web.async_client import AsyncWebClient

from channels.base import Target
from channels.slack.api import SlackApi, SlackCallError
from channels.slack.format import format_parts, preview_part
from channels.slack.stream import SlackReplyStream
from tests.fakes.slack_server import FakeSlack

CHANNEL_TARGET = Target(channel="slack", chat_id="C1", thread_id="100.1", reply_to="100.1")


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


@pytest.fixture
async def api(fake: FakeSlack) -> AsyncIterator[SlackApi]:
    async with aiohttp.ClientSession() as session:
        client = AsyncWebClient(
            token=fake.bot_token, base_url=fake.api_url, session=session, retry_handlers=[]
        )
        yield SlackApi(client)


def open_stream(api: SlackApi, target: Target = CHANNEL_TARGET, interval_s: float = 1.0) -> SlackReplyStream:
    return SlackReplyStream(api, target, "run-1", format_preview=preview_part, interval_s=interval_s)


async def test_eyes_reaction_while_working(fake: FakeSlack, api: SlackApi) -> None:
    stream = open_stream(api)
    await stream.start()
    await stream.start()
    assert fake.reactions == {("C1", "100.1", "eyes")}
    [add] = fake.calls_to("reactions.add")
    assert add.args == {"channel": "C1", "timestamp": "100.1", "name": "eyes"}
    await stream.close()
    await stream.close()
    assert fake.reactions == set()
    assert len(fake.calls_to("reactions.remove")) == 1


async def test_no_reaction_without_a_message_to_react_to(fake: FakeSlack, api: SlackApi) -> None:
    stream = open_stream(api, Target(channel="slack", chat_id="C1"))
    await stream.start()
    await stream.close()
    assert fake.calls == []


async def test_reaction_failure_does_not_raise(fake: FakeSlack, api: SlackApi) -> None:
    fake.fail("reactions.add", "missing_scope")
    stream = open_stream(api)
    await stream.start()
    await stream.close()
    assert fake.calls_to("reactions.remove") == []


async def test_preview_is_posted_then_updated_at_most_once_per_interval(
    fake: FakeSlack, api: SlackApi
) -> None:
    stream = open_stream(api, interval_s=1.0)
    text = ""
    await stream.preview("Hello")
    assert fake.calls == []  # preview never waits for the network
    loop = asyncio.get_running_loop()
    started = loop.time()
    while loop.time() - started < 2.6:
        text += "word "
        await stream.preview("Hello **" + text.strip() + "**")
        await asyncio.sleep(0.05)
    await fake.wait_calls("chat.update", 2)
    [post] = fake.calls_to("chat.postMessage")
    assert post.args["thread_ts"] == "100.1"
    assert post.args["text"].startswith("Hello")  # the newest text when the send happened
    sends = [c for c in fake.calls if c.method in ("chat.postMessage", "chat.update")]
    assert 3 <= len(sends) <= 4
    gaps = [b.at - a.at for a, b in itertools.pairwise(sends)]
    assert all(gap >= 0.8 for gap in gaps), gaps

    final = "Hello **" + text.strip() + "** — done."
    [part] = format_parts(final)
    ts = await stream.deliver(0, part)
    assert ts == next(iter(fake.messages))[1]
    assert fake.messages[("C1", ts)]["text"] == part
    assert len(fake.calls_to("chat.postMessage")) == 1  # the placeholder became the answer
    await stream.discard()  # nothing left to discard: the answer stays
    assert ("C1", ts) in fake.messages


async def test_pending_preview_is_flushed_after_the_interval(fake: FakeSlack, api: SlackApi) -> None:
    stream = open_stream(api, interval_s=0.3)
    await stream.preview("one")
    await fake.wait_calls("chat.postMessage", 1)
    await stream.preview("one two")
    await stream.preview("one two three")
    [update] = await fake.wait_calls("chat.update", 1)
    assert update.args["text"] == "one two three"
    await asyncio.sleep(0.5)
    assert len(fake.calls_to("chat.update")) == 1


async def test_failed_final_update_falls_back_to_a_new_post(fake: FakeSlack, api: SlackApi) -> None:
    stream = open_stream(api)
    await stream.preview("draft")
    [placeholder] = await fake.wait_calls("chat.postMessage", 1)
    placeholder_ts = next(iter(fake.messages))[1]
    fake.fail("chat.update", "cant_update_message")
    ts = await stream.deliver(0, "final answer")
    assert ts != placeholder_ts
    assert fake.messages[("C1", ts)]["text"] == "final answer"
    assert fake.messages[("C1", ts)]["thread_ts"] == "100.1"
    assert ("C1", placeholder_ts) not in fake.messages  # the stale draft is gone
    assert placeholder.args["text"] == "draft"


async def test_discard_deletes_the_placeholder(fake: FakeSlack, api: SlackApi) -> None:
    stream = open_stream(api)
    await stream.preview("thinking out loud")
    await fake.wait_calls("chat.postMessage", 1)
    await stream.discard()
    await stream.discard()
    assert fake.messages == {}
    assert len(fake.calls_to("chat.delete")) == 1
    await stream.preview("too late")
    await asyncio.sleep(0.05)
    assert len(fake.calls_to("chat.postMessage")) == 1


async def test_discard_waits_for_a_placeholder_still_being_posted(fake: FakeSlack, api: SlackApi) -> None:
    fake.latency_s = 0.3
    stream = open_stream(api)
    await stream.preview("slow draft")
    await fake.wait_calls("chat.postMessage", 1)  # received, not answered yet
    await stream.discard()
    assert fake.messages == {}  # posted, then deleted: no orphan placeholder


async def test_long_answer_is_posted_as_several_parts_in_the_thread(fake: FakeSlack, api: SlackApi) -> None:
    stream = open_stream(api)
    await stream.start()
    answer = "\n\n".join(f"Section {i}. " + "lorem ipsum " * 60 for i in range(20))
    parts = format_parts(answer)
    assert len(parts) >= 3
    ids = [await stream.deliver(i, part) for i, part in enumerate(parts)]
    await stream.close()
    posts = fake.calls_to("chat.postMessage")
    assert [p.args["text"] for p in posts] == parts
    assert all(p.args["thread_ts"] == "100.1" for p in posts)
    assert len(set(ids)) == len(parts)
    assert fake.reactions == set()


async def test_deliver_is_idempotent_per_part(fake: FakeSlack, api: SlackApi) -> None:
    stream = open_stream(api)
    first = await stream.deliver(0, "a")
    again = await stream.deliver(0, "a")
    assert first == again
    assert len(fake.calls_to("chat.postMessage")) == 1


async def test_dm_reply_is_not_threaded(fake: FakeSlack, api: SlackApi) -> None:
    stream = open_stream(api, Target(channel="slack", chat_id="D9", reply_to="5.5"))
    await stream.deliver(0, "hi")
    [post] = fake.calls_to("chat.postMessage")
    assert "thread_ts" not in post.args and post.args["channel"] == "D9"


async def test_failed_delivery_raises_for_the_gateway(fake: FakeSlack, api: SlackApi) -> None:
    stream = open_stream(api)
    fake.fail("chat.postMessage", "channel_not_found")
    with pytest.raises(SlackCallError, match="channel_not_found"):
        await stream.deliver(0, "x")


async def test_ratelimited_final_update_is_retried_after_retry_after(fake: FakeSlack, api: SlackApi) -> None:
    stream = open_stream(api)
    await stream.preview("draft")
    await fake.wait_calls("chat.postMessage", 1)
    fake.rate_limit("chat.update", times=1, retry_after=1)
    ts = await stream.deliver(0, "final")
    first, second = fake.calls_to("chat.update")
    assert second.at - first.at >= 0.9
    assert fake.messages[("C1", ts)]["text"] == "final"
