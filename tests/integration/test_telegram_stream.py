"""Outbound: reply streams, formatting on the wire, flood control and retries, approvals."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from structlog.testing import capture_logs
from telegram import Message
from telegram.error import NetworkError

from agent.types import TelegramChat
from channels.base import DeliveryUnknown, Target
from channels.chunking import utf16_len
from channels.telegram.adapter import TelegramChannel
from tests.fakes.telegram_context import TelegramHarness

pytestmark = pytest.mark.timeout(60)

DM = Target(channel="telegram", chat_id="42", reply_to="7", chat=TelegramChat(chat_type="private"))
GROUP = Target(channel="telegram", chat_id="-1001", reply_to="7", chat=TelegramChat(chat_type="supergroup"))
TOPIC = Target(channel="telegram", chat_id="-1003", thread_id="77", reply_to="9",
               chat=TelegramChat(chat_type="supergroup", is_forum=True))
GENERAL = Target(channel="telegram", chat_id="-1003", reply_to="10", chat=TelegramChat(chat_type="supergroup", is_forum=True))


@pytest.fixture
async def h(redis_client: aioredis.Redis, redis_prefix: str) -> AsyncIterator[TelegramHarness]:
    async with TelegramHarness(redis_client, redis_prefix) as harness:
        harness.fake.chat(-1003, kind="supergroup", forum=True)
        yield harness


@pytest.fixture
async def ch(h: TelegramHarness) -> TelegramChannel:
    return await h.channel()


async def test_typing_is_sent_repeatedly_while_open(h: TelegramHarness, ch: TelegramChannel) -> None:
    stream = ch.open_stream(TOPIC, "run-1")
    await stream.start()
    calls = await h.fake.wait_calls("sendChatAction", 2)
    await stream.close()
    assert calls[0].params == {"chat_id": -1003, "action": "typing", "message_thread_id": 77}
    count = len(h.fake.calls_to("sendChatAction"))
    await asyncio.sleep(0.8)
    assert len(h.fake.calls_to("sendChatAction")) == count  # stopped by close()


async def test_preview_is_throttled_then_finalized(h: TelegramHarness, ch: TelegramChannel) -> None:
    stream = ch.open_stream(DM, "run-2")
    await stream.start()
    text = ""
    for i in range(40):
        text += f"word{i} "
        await stream.preview(text)
        await asyncio.sleep(0.03)
    await asyncio.sleep(0.4)
    pushes = [c for c in h.fake.calls if c.method in ("sendMessage", "editMessageText")]
    assert pushes[0].method == "sendMessage" and all(c.method == "editMessageText" for c in pushes[1:])
    gaps = [b.at - a.at for a, b in itertools.pairwise(pushes)]
    assert gaps and min(gaps) >= 0.3 * 0.9  # stream_edit_interval_s of the harness
    assert len(pushes) < 40
    [preview] = h.fake.sent_messages(42)
    assert preview.text == text.strip()

    message_id = await stream.deliver(0, "<b>Final</b> answer")
    await stream.close()
    [final] = h.fake.sent_messages(42)
    assert message_id == str(final.message_id) == str(preview.message_id)
    assert final.text == "Final answer" and final.raw == "<b>Final</b> answer" and final.parse_mode == "HTML"
    assert await stream.deliver(0, "<b>Final</b> answer") == message_id  # idempotent per part


async def test_answers_to_sends_and_edits_are_read_for_their_id_only(
    h: TelegramHarness, ch: TelegramChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each answer is a whole Message (with the one replied to); botd needs its id, or nothing.
    parsed: list[object] = []
    parse = Message.de_json

    def counted(data: object, bot: object = None) -> object:
        parsed.append(data)
        return parse(data, bot)  # type: ignore[arg-type]

    monkeypatch.setattr(Message, "de_json", counted)
    stream = ch.open_stream(TOPIC, "run-ids")
    await stream.preview("draft")
    await h.fake.wait_calls("sendMessage")
    await stream.preview("draft, longer")
    await h.fake.wait_calls("editMessageText")
    message_id = await stream.deliver(0, "the answer")
    await stream.close()
    [final] = h.fake.sent_messages(-1003)
    assert message_id == str(final.message_id) and final.text == "the answer" and final.reply_to == 9
    assert await ch.send_text(TOPIC, "a notice") == str(final.message_id + 1)
    assert parsed == []


async def test_late_preview_never_overwrites_final(h: TelegramHarness, ch: TelegramChannel) -> None:
    stream = ch.open_stream(DM, "run-3")
    await stream.preview("draft one")
    await h.fake.wait_calls("sendMessage")
    await stream.preview("draft two")  # pending behind the throttle
    await stream.deliver(0, "final")
    await stream.preview("draft three")
    await asyncio.sleep(0.5)
    [msg] = h.fake.sent_messages(42)
    assert msg.text == "final"


async def test_final_edit_failure_falls_back_to_new_message(h: TelegramHarness, ch: TelegramChannel) -> None:
    stream = ch.open_stream(GROUP, "run-4")
    await stream.preview("thinking…")
    await h.fake.wait_calls("sendMessage")
    [preview] = h.fake.sent_messages(-1001)
    preview.deleted = True  # someone deleted the preview
    message_id = await stream.deliver(0, "the answer")
    [final] = h.fake.sent_messages(-1001)
    assert final.message_id != preview.message_id and message_id == str(final.message_id)
    assert final.text == "the answer" and final.reply_to == 7


async def test_not_modified_is_not_an_error(h: TelegramHarness, ch: TelegramChannel) -> None:
    stream = ch.open_stream(DM, "run-5")
    await stream.preview("same text")
    await h.fake.wait_calls("sendMessage")
    message_id = await stream.deliver(0, "same text")
    assert h.fake.calls_to("editMessageText")[-1].status == 400
    [msg] = h.fake.sent_messages(42)
    assert message_id == str(msg.message_id)


async def test_discard_deletes_preview(h: TelegramHarness, ch: TelegramChannel) -> None:
    stream = ch.open_stream(DM, "run-6")
    await stream.start()
    await stream.preview("NO_REPLY would never get here, but some draft did")
    await h.fake.wait_calls("sendMessage")
    await stream.discard()
    await stream.close()
    await stream.discard()  # safe twice
    assert h.fake.sent_messages(42) == []
    assert len(h.fake.calls_to("deleteMessage")) == 1


async def test_long_answer_is_split_into_messages(h: TelegramHarness, ch: TelegramChannel) -> None:
    markdown = "\n\n".join(f"## Section {i}\n\n" + "Some *formatted* text with `code`. " * 40 for i in range(8))
    markdown += "\n\n```python\n" + "\n".join(f"x_{i} = {i} < {i + 1}" for i in range(300)) + "\n```"
    parts = ch.format_parts(markdown)
    assert len(parts) >= 3
    stream = ch.open_stream(GROUP, "run-7")
    await stream.preview(markdown[:500])
    await h.fake.wait_calls("sendMessage")
    ids = [await stream.deliver(i, part) for i, part in enumerate(parts)]
    await stream.close()
    sent = h.fake.sent_messages(-1001)
    assert [str(m.message_id) for m in sent] == ids
    assert all(m.parse_mode == "HTML" and utf16_len(m.raw) <= 4096 for m in sent)
    assert sent[0].reply_to == 7 and all(m.reply_to is None for m in sent[1:])
    assert "x_299 = 299 < 300" in sent[-1].text


async def test_parse_error_resends_as_plain_text(h: TelegramHarness, ch: TelegramChannel) -> None:
    h.fake.reject_html.append("<b>")
    with capture_logs() as logs:
        message_id = await ch.send_text(DM, "**bold** & <more>")
    [msg] = h.fake.sent_messages(42)
    assert message_id == str(msg.message_id)
    assert msg.parse_mode is None and msg.text == "bold & <more>"
    assert any(e["event"] == "telegram.parse_error_resend_plain" for e in logs)


async def test_rate_limit_is_honoured(h: TelegramHarness, ch: TelegramChannel) -> None:
    h.fake.rate_limit("sendMessage", retry_after=1)
    message_id = await ch.send_text(DM, "after the flood wait")
    first, second = h.fake.calls_to("sendMessage")
    assert first.status == 429 and second.status == 200
    assert second.at - first.at >= 0.95
    assert message_id == str(h.fake.sent_messages(42)[0].message_id)


async def test_transient_errors_are_retried_then_fail(h: TelegramHarness, ch: TelegramChannel) -> None:
    h.fake.fail_next("sendMessage", code=502, description="Bad Gateway", times=2)
    await ch.send_text(DM, "eventually")
    assert [c.status for c in h.fake.calls_to("sendMessage")] == [502, 502, 200]

    h.fake.fail_next("sendMessage", code=502, description="Bad Gateway", times=10)
    stream = ch.open_stream(DM, "run-fail")
    with capture_logs() as logs, pytest.raises(NetworkError):
        await stream.deliver(0, "never arrives")
    failed = [e for e in logs if e["event"] == "telegram.send_failed"]
    assert failed and failed[0]["run_id"] == "run-fail" and failed[0]["attempts"] == 4


async def test_topic_reply_lands_in_topic(h: TelegramHarness, ch: TelegramChannel) -> None:
    await ch.send_text(TOPIC, "in the topic")
    [call] = h.fake.calls_to("sendMessage")
    assert call.params["message_thread_id"] == 77
    assert call.params["reply_parameters"] == {"message_id": 9, "allow_sending_without_reply": True}
    [msg] = h.fake.sent_messages(-1003)
    assert msg.data["message_thread_id"] == 77 and msg.data["is_topic_message"] is True


async def test_general_topic_omits_thread(h: TelegramHarness, ch: TelegramChannel) -> None:
    await ch.send_text(GENERAL, "in general")
    [call] = h.fake.calls_to("sendMessage")
    assert "message_thread_id" not in call.params
    assert call.params["reply_parameters"]["message_id"] == 10


async def test_dm_reply_is_not_threaded_or_quoted(h: TelegramHarness, ch: TelegramChannel) -> None:
    await ch.send_text(DM, "hi")
    [call] = h.fake.calls_to("sendMessage")
    assert "reply_parameters" not in call.params and "message_thread_id" not in call.params


async def test_send_text_formats_notices(h: TelegramHarness, ch: TelegramChannel) -> None:
    assert await ch.send_text(DM, "Stopped.") is not None
    assert await ch.send_text(DM, "   ") is None
    [msg] = h.fake.sent_messages(42)
    assert msg.raw == "Stopped." and msg.parse_mode == "HTML"


async def test_approval_buttons(h: TelegramHarness, ch: TelegramChannel) -> None:
    await ch.ask_approval(GROUP, "abc123", "Run admin tool `bash`: rm -rf <tmp> & co")
    [msg] = h.fake.sent_messages(-1001)
    buttons = msg.reply_markup["inline_keyboard"][0] if msg.reply_markup else []
    assert [b["callback_data"] for b in buttons] == ["ap:abc123:y", "ap:abc123:n"]
    assert "rm -rf <tmp> & co" in msg.text and msg.reply_to == 7
    with pytest.raises(ValueError, match="approval id"):
        await ch.ask_approval(GROUP, "bad id:with:colons", "x")


async def test_outbound_before_start_is_a_clear_error(h: TelegramHarness) -> None:
    channel = await h.channel(start=False)
    with pytest.raises(RuntimeError, match="not started"):
        channel.open_stream(DM, "r")


async def test_token_never_reaches_logs(h: TelegramHarness, ch: TelegramChannel, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with capture_logs() as logs:
        await ch.send_text(DM, "hi")
        h.fake.fail_next("sendMessage", code=502, description=f"Bad Gateway at /bot{h.fake.token}/x", times=10)
        with pytest.raises(NetworkError):
            await ch.send_text(DM, "fails")
    assert "HTTP Request: POST" in caplog.text and "<telegram-token>" in caplog.text
    assert h.fake.token not in caplog.text
    assert any(e["event"] == "telegram.send_failed" for e in logs)
    assert h.fake.token not in repr(logs)


async def test_replies_still_go_out_after_intake_stopped(h: TelegramHarness, ch: TelegramChannel) -> None:
    stream = ch.open_stream(DM, "run-shutdown")
    await stream.preview("working on it")
    await h.fake.wait_calls("sendMessage")
    await ch.stop()  # graceful shutdown: intake first, runs finish afterwards
    assert not ch.is_ready()
    await stream.deliver(0, "done before exit")
    assert await ch.send_text(DM, "Stopped.") is not None
    assert [m.text for m in h.fake.sent_messages(42)] == ["done before exit", "Stopped."]
    await ch.aclose()
    with pytest.raises(RuntimeError, match="not started"):
        await ch.send_text(DM, "too late")


def bot_calls(h: TelegramHarness) -> list[str]:
    """The Bot API methods called so far, typing and polling left out."""
    return [c.method for c in h.fake.calls if c.method not in ("sendChatAction", "getUpdates", "deleteWebhook",
                                                                 "getMe", "setMyCommands", "deleteMyCommands")]


async def test_an_answer_complete_before_the_first_preview_is_due_is_sent_once(
    h: TelegramHarness, redis_client: aioredis.Redis
) -> None:
    ch = await h.channel(stream_edit_interval_s=10.0, first_preview_delay_s=5.0)
    before = len(bot_calls(h))
    stream = ch.open_stream(GROUP, "run-fast")
    await stream.start()
    for text in ("The", "The answer", "The answer is 42."):
        await stream.preview(text)
        await asyncio.sleep(0.01)
    message_id = await stream.deliver(0, "The answer is <b>42</b>.")
    await stream.close()
    await asyncio.sleep(0.3)  # nothing may follow: no late preview, no delete

    assert bot_calls(h)[before:] == ["sendMessage"]
    [msg] = h.fake.sent_messages(-1001, include_deleted=True)
    assert message_id == str(msg.message_id) and msg.raw == "The answer is <b>42</b>." and msg.edits == 0
    assert msg.reply_to == 7  # the final answer quotes the trigger in a group
    assert await redis_client.keys("*telegram:preview:run-fast*") == []  # no preview was ever remembered


async def test_a_slow_answer_still_shows_a_preview_that_becomes_the_answer(h: TelegramHarness) -> None:
    ch = await h.channel(first_preview_delay_s=0.1)
    stream = ch.open_stream(DM, "run-slow")
    await stream.start()
    await stream.preview("Thinking about the first part")
    await h.fake.wait_calls("sendMessage")  # the answer is still streaming: the preview shows
    [preview] = h.fake.sent_messages(42)
    assert preview.text == "Thinking about the first part"
    await stream.preview("Thinking about the first part and the second")
    await h.fake.wait_calls("editMessageText")  # later previews edit it

    message_id = await stream.deliver(0, "<b>Done</b>")
    await stream.close()
    [final] = h.fake.sent_messages(42, include_deleted=True)
    assert message_id == str(final.message_id) == str(preview.message_id) and final.text == "Done"


async def test_a_silent_answer_before_the_first_preview_sends_nothing(h: TelegramHarness) -> None:
    ch = await h.channel(stream_edit_interval_s=10.0, first_preview_delay_s=5.0)
    before = len(bot_calls(h))
    stream = ch.open_stream(DM, "run-quiet")
    await stream.start()
    await stream.preview("NO_")
    await stream.discard()
    await stream.close()
    await asyncio.sleep(0.3)
    assert bot_calls(h)[before:] == [] and h.fake.sent_messages(42, include_deleted=True) == []


async def test_an_answer_lost_after_the_message_went_out_is_not_sent_twice(
    h: TelegramHarness, ch: TelegramChannel
) -> None:
    # The Bot API made the message and the connection closed before its answer: sending
    # it again would show it twice. The part's fate is unknown, and it is not resent. (A
    # connection closed before the call took effect looks the same from here, and is not
    # resent either: parts are at most once. Errors the Bot API answers are retried.)
    h.fake.drop_next("sendMessage", after_effect=True)
    stream = ch.open_stream(DM, "run-lost-answer")
    with pytest.raises(DeliveryUnknown):
        await stream.deliver(0, "shown once")
    assert [m.text for m in h.fake.sent_messages(42)] == ["shown once"]
    assert len(h.fake.calls_to("sendMessage")) == 1

