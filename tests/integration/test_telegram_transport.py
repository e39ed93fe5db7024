"""python-telegram-bot's requests over botd's HTTP client: the wire, timeouts and dropped
connections as the library's errors, and no token in any error text."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup
from telegram.error import BadRequest, NetworkError, TimedOut

from channels.telegram.transport import BotAPIRequest
from tests.fakes.telegram_server import FakeTelegram

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    server = FakeTelegram()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def bot(fake: FakeTelegram) -> AsyncIterator[Bot]:
    client = Bot(fake.token, base_url=fake.base_url, request=BotAPIRequest(read_timeout=0.5, connect_timeout=2))
    await client.initialize()
    try:
        yield client
    finally:
        await client.shutdown()


async def test_calls_go_out_as_form_fields_and_answers_become_objects(fake: FakeTelegram, bot: Bot) -> None:
    sent = await bot.send_message(42, "<b>hi</b> &amp; bye", parse_mode="HTML")
    [call] = fake.calls_to("sendMessage")
    assert call.params == {"chat_id": 42, "text": "<b>hi</b> &amp; bye", "parse_mode": "HTML"}
    assert sent.message_id == fake.sent_messages(42)[0].message_id and sent.text == "hi & bye"
    assert await bot.send_chat_action(42, "typing") is True


async def test_form_fields_keep_every_character_and_structure(fake: FakeTelegram, bot: Bot) -> None:
    text = "a&b=c+d %20 é 😀\nline; #x ?y"
    await bot.send_message(42, text, reply_markup=InlineKeyboardMarkup([[InlineKeyboardButton("ok", callback_data="c=1&d")]]))
    [call] = fake.calls_to("sendMessage")
    assert call.params["text"] == text
    assert call.params["reply_markup"] == {"inline_keyboard": [[{"text": "ok", "callback_data": "c=1&d"}]]}
    assert (await bot.get_me()).id == fake.bot_id  # a call with no fields at all


async def test_an_error_answer_keeps_its_meaning(fake: FakeTelegram, bot: Bot) -> None:
    fake.fail_next("sendMessage", code=400, description="Bad Request: chat not found")
    with pytest.raises(BadRequest, match="(?i)chat not found"):
        await bot.send_message(42, "x")


async def test_a_hanging_answer_is_a_timeout(fake: FakeTelegram, bot: Bot) -> None:
    fake.chaos("sendMessage", 1.0, kinds=("timeout",), hang_s=2.0)
    with pytest.raises(TimedOut) as caught:
        await bot.send_message(42, "x")
    assert fake.token not in str(caught.value)


@pytest.mark.parametrize("kind", ["drop", "drop_after"])
async def test_a_dropped_connection_is_a_network_error_without_the_token(
    fake: FakeTelegram, bot: Bot, kind: str
) -> None:
    fake.chaos("sendMessage", 1.0, kinds=(kind,))
    with pytest.raises(NetworkError) as caught:
        await bot.send_message(42, "x")
    assert not isinstance(caught.value, TimedOut)
    assert fake.token not in str(caught.value) and "bot api url" not in str(caught.value).lower()
    fake.calm()
    assert (await bot.send_message(42, "again")).text == "again"  # the pool recovers


async def test_nothing_listening_is_a_network_error_without_the_token() -> None:
    token = "123456789:AAFakeTokenForTestsOnly_abcdefghijkl"
    client = Bot(token, base_url="http://127.0.0.1:9/bot", request=BotAPIRequest(connect_timeout=2))
    request = BotAPIRequest(connect_timeout=2)
    await request.initialize()
    try:
        with pytest.raises(NetworkError) as caught:
            await request.post(f"http://127.0.0.1:9/bot{token}/getMe")
        assert token not in str(caught.value)
    finally:
        await request.shutdown()
    with pytest.raises(NetworkError, match="not initialized"):  # the library wraps what its transport raised
        await client.get_me()


async def test_the_proxy_comes_from_the_environment_once_per_origin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example")
    request = BotAPIRequest()
    await request.initialize()
    try:
        proxy, _ = request._proxy_for("https://api.telegram.org/bot1:x/getMe")
        assert str(proxy) == "http://proxy.example:3128"
        assert request._proxy_for("https://internal.example/bot1:x/getMe") == (None, None)
        monkeypatch.delenv("HTTPS_PROXY")
        proxy, _ = request._proxy_for("https://api.telegram.org/bot1:x/sendMessage")
        assert str(proxy) == "http://proxy.example:3128"  # read once per session, as httpx did at start
    finally:
        await request.shutdown()
