"""The Telegram update normalizer under hostile updates (no network).

``Update.de_json`` may refuse a dict with any exception (the webhook answers 400); what it
accepts, ``normalize_update`` must decide on, raising nothing but ``MalformedUpdate``.
Valid messages from allowed people always become one Inbound with their text intact.
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from telegram import Update

from channels.telegram.intake import Access, BotIdentity, Ignored, Inbound, MalformedUpdate, normalize_update
from channels.telegram.settings import TelegramSettings
from tests.fakes.telegram_server import FakeTelegram
from tests.fuzz.strategies import hostile_text, json_values, mutate

TOKEN = "123456789:AAFakeTokenForTestsOnly_abcdefghijkl"
ME = BotIdentity(id=123456789, username="botd_test_bot")
ALLOWED_ID, ALLOWED_NAME = 42, "ann_x"
ACCESS = Access(TelegramSettings(token=TOKEN, allow_from=(str(ALLOWED_ID), f"@{ALLOWED_NAME}"), groups=("-100",)))

PHOTO = {"photo": [{"file_id": "f", "file_unique_id": "u", "width": 1, "height": 1}]}
MEDIA: list[dict[str, Any]] = [
    PHOTO,
    {"location": {"latitude": 52.5, "longitude": 13.4}},
    {"document": {"file_id": "f", "file_unique_id": "u", "file_name": "a.pdf"}},
    {"sticker": {"file_id": "f", "file_unique_id": "u", "width": 1, "height": 1, "is_animated": False,
                 "is_video": False, "type": "regular", "emoji": "😀"}},
    {"dice": {"emoji": "🎲", "value": 3}},
    {"contact": {"phone_number": "1", "first_name": "Bob"}},
]


def _fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _fake() -> FakeTelegram:
    return FakeTelegram(TOKEN)


@st.composite
def real_updates(draw: st.DrawFn) -> dict[str, Any]:
    """Updates in the shapes Telegram sends, from the fake's builders."""
    fake = _fake()
    text = draw(st.one_of(hostile_text, st.sampled_from(["@botd_test_bot hi", "/stop@botd_test_bot", "/help", "hi"])))
    user_id = draw(st.sampled_from([ALLOWED_ID, 43, 7, ME.id]))
    username = draw(st.sampled_from([None, ALLOWED_NAME, "Ann_X", "other"]))
    kind = draw(st.integers(0, 6))
    if kind == 0:
        msg = fake.private_message(user_id, text, username=username)
    elif kind == 1:
        msg = fake.group_message(draw(st.sampled_from([-100, -200])), user_id, text, username=username,
                                 forum=draw(st.booleans()), topic_id=draw(st.sampled_from([None, 7])))
    elif kind == 2:
        msg = fake.private_message(user_id, None, caption=text, media=draw(st.sampled_from(MEDIA)))
    elif kind == 3:
        bot_msg = fake.message(fake.chat(-100), fake.bot_user, "answer")
        msg = fake.group_message(-100, user_id, text, reply_to=bot_msg["message_id"])
    elif kind == 4:
        target = fake.private_message(user_id, "approve?")
        data = draw(st.sampled_from(["ap:abc_1:y", "ap:abc:n", "ap::y", "x", "ap:" + "a" * 60 + ":y"]))
        return {"update_id": 1, **fake.callback_update(fake.user(user_id, username=username), target, data)}
    elif kind == 5:
        return {"update_id": 1, "edited_message": fake.private_message(user_id, text)}
    else:
        msg = fake.private_message(user_id, text, extra={"sender_chat": {"id": -5, "type": "channel"}})
    return {"update_id": draw(st.integers(0, 2**31)), "message": msg}


_KEYS = st.sampled_from(["message", "text", "chat", "from", "entities", "caption", "type", "id", "offset", "length",
                         "reply_to_message", "message_thread_id", "is_forum", "is_topic_message", "callback_query",
                         "data", "user", "photo", "sticker", "location", "username", "is_bot", "update_id"])


def _decide(data: Any) -> Inbound | Ignored | None:
    """What the webhook path does: None where de_json refuses the dict (answered 400)."""
    try:
        update = Update.de_json(data, None)
    except Exception:
        return None
    try:
        return normalize_update(update, ME, ACCESS)
    except MalformedUpdate:
        return None


def _check_inbound(result: Inbound) -> None:
    assert isinstance(result.text, str) and result.text.strip() == result.text
    assert result.text or result.attachments  # a file alone is a message; nothing at all is not
    assert isinstance(result.user_id, str) and isinstance(result.chat_id, str)
    if result.scope == "dm" or result.callback_id is not None:
        assert ACCESS.user_listed_id(result.user_id, result.username), result


@_fuzz(600)
@given(data=st.data())
def test_mutated_real_updates_raise_only_malformed_update(data: st.DataObject) -> None:
    update = mutate(data.draw(real_updates()), data.draw, keys=_KEYS)
    result = _decide(update)
    event(type(result).__name__)
    if isinstance(result, Inbound):
        _check_inbound(result)


@_fuzz(300)
@given(update=st.one_of(
    st.dictionaries(st.text(max_size=15), json_values, max_size=6),
    st.fixed_dictionaries({"update_id": st.integers(), "message": st.dictionaries(_KEYS, json_values, max_size=8)}),
    st.fixed_dictionaries({"update_id": st.integers(), "callback_query": st.dictionaries(_KEYS, json_values)}),
))
def test_arbitrary_dicts_raise_only_malformed_update(update: dict[str, Any]) -> None:
    result = _decide(update)
    event(type(result).__name__)
    if isinstance(result, Inbound):
        _check_inbound(result)


def _no_bot_handle(text: str) -> bool:
    return "@botd_test_bot" not in text.lower()


@_fuzz(400)
@given(
    text=hostile_text.filter(_no_bot_handle),
    user=st.sampled_from([(ALLOWED_ID, None), (7, ALLOWED_NAME), (8, "ANN_X")]),
)
def test_allowed_dm_keeps_its_text(text: str, user: tuple[int, str | None]) -> None:
    user_id, username = user
    update = {"update_id": 9, "message": _fake().private_message(user_id, text, username=username)}
    result = normalize_update(Update.de_json(update, None), ME, ACCESS)
    if not text.strip():
        assert isinstance(result, Ignored)
        return
    assert isinstance(result, Inbound), result
    assert (result.scope, result.chat_id, result.user_id) == ("dm", str(user_id), str(user_id))
    assert result.text == text.strip()


@_fuzz(300)
@given(
    text=hostile_text.filter(_no_bot_handle).filter(lambda t: not re.match(r"\s*[,:;]", t)),
    how=st.sampled_from(["@botd_test_bot {}", "{} @botd_test_bot", "@BOTD_TEST_BOT, {}", "reply", "/stop@botd_test_bot {}"]),
    topic=st.sampled_from([None, 7]),
)
def test_addressed_group_message_keeps_its_text(text: str, how: str, topic: int | None) -> None:
    fake = _fake()
    if how == "reply":
        bot_msg = fake.message(fake.chat(-100, forum=topic is not None), fake.bot_user, "answer", topic_id=topic)
        msg = fake.group_message(-100, 43, text, forum=topic is not None, topic_id=topic, reply_to=bot_msg["message_id"])
        expected = text
    else:
        msg = fake.group_message(-100, 43, how.format(text), forum=topic is not None, topic_id=topic)
        expected = how.replace("@botd_test_bot", "").replace("@BOTD_TEST_BOT,", "").format(text)
    result = normalize_update(Update.de_json({"update_id": 3, "message": msg}, None), ME, ACCESS)
    if not expected.strip():
        assert isinstance(result, Ignored)
        return
    assert isinstance(result, Inbound), result
    assert (result.scope, result.chat_id) == ("group", "-100")
    assert result.topic_id == (str(topic) if topic else None)
    assert "".join(result.text.split()) == "".join(expected.split())


@_fuzz(200)
@given(text=hostile_text, user_id=st.integers(min_value=1, max_value=2**40).filter(lambda i: i not in (ALLOWED_ID, ME.id)))
def test_strangers_get_nothing(text: str, user_id: int) -> None:
    fake = _fake()
    for update in (
        {"update_id": 1, "message": fake.private_message(user_id, text or "x", username="someone")},
        {"update_id": 2, "message": fake.group_message(-200, user_id, f"@botd_test_bot {text}")},
        {"update_id": 3, **fake.callback_update(fake.user(user_id), fake.private_message(user_id, "q"), "ap:abc:y")},
    ):
        result = normalize_update(Update.de_json(update, None), ME, ACCESS)
        assert isinstance(result, Ignored), result
