"""Normalization of Telegram updates and the access rules (no network)."""

from __future__ import annotations

from typing import Any

import pytest
from telegram import Update

from agent.types import Attachment
from channels.telegram.intake import DM_NOT_ALLOWED, Access, BotIdentity, Ignored, Inbound, normalize_update
from channels.telegram.settings import TelegramSettings
from tests.fakes.telegram_server import FakeTelegram

TOKEN = "123456789:AAFakeTokenForTestsOnly_abcdefghijkl"
ME = BotIdentity(id=123456789, username="botd_test_bot")


def settings(**kw: Any) -> TelegramSettings:
    return TelegramSettings(token=TOKEN, **kw)


def run(update: dict[str, Any], **kw: Any) -> Inbound | Ignored:
    return normalize_update(Update.de_json(update, None), ME, Access(settings(**kw)))


def inbound(update: dict[str, Any], **kw: Any) -> Inbound:
    result = run(update, **kw)
    assert isinstance(result, Inbound), result
    return result


def ignored(update: dict[str, Any], **kw: Any) -> Ignored:
    result = run(update, **kw)
    assert isinstance(result, Ignored), result
    return result


@pytest.fixture
def fake() -> FakeTelegram:
    return FakeTelegram(TOKEN)


def upd(fake: FakeTelegram, message: dict[str, Any], kind: str = "message") -> dict[str, Any]:
    return {"update_id": 1000, kind: message}


# -- DMs and access ----------------------------------------------------------------------------


def test_dm_from_allowlisted_user(fake: FakeTelegram) -> None:
    msg = fake.private_message(42, "hello there", username="ann", first_name="Ann")
    got = inbound(upd(fake, msg), allow_from=("42",))
    assert (got.scope, got.chat_id, got.user_id, got.text) == ("dm", "42", "42", "hello there")
    assert got.topic_id is None and got.message_id == str(msg["message_id"]) and got.user_name == "Ann"


def test_pairing_denies_a_stranger_until_the_adapter_lists_the_approved_user(fake: FakeTelegram) -> None:
    msg = fake.private_message(42, "hello", first_name="Ann")
    access = Access(settings(dm_policy="pairing", allow_from=("7",)))
    stranger = normalize_update(Update.de_json(upd(fake, msg), None), ME, access)
    assert isinstance(stranger, Ignored) and stranger.reason == DM_NOT_ALLOWED and stranger.unauthorized
    paired = access.with_user("42")
    assert isinstance(normalize_update(Update.de_json(upd(fake, msg), None), ME, paired), Inbound)
    assert not access.user_listed_id("42", None)  # the original access is unchanged
    assert paired.user_listed_id("7", None)


def test_dm_allowlist_by_username_case_insensitive(fake: FakeTelegram) -> None:
    msg = fake.private_message(42, "hi", username="Ann_X")
    assert inbound(upd(fake, msg), allow_from=("@ann_x",)).user_id == "42"


def test_empty_allowlist_admits_nobody(fake: FakeTelegram) -> None:
    got = ignored(upd(fake, fake.private_message(42, "hi")))
    assert got.unauthorized and got.user_id == "42"


def test_unlisted_user_is_unauthorized(fake: FakeTelegram) -> None:
    got = ignored(upd(fake, fake.private_message(43, "hi")), allow_from=("42", "@someone"))
    assert got.unauthorized and got.user_id == "43"


def test_open_dm_policy_admits_anyone(fake: FakeTelegram) -> None:
    assert inbound(upd(fake, fake.private_message(99, "hi")), dm_policy="open").user_id == "99"


def test_allowlist_entries_with_prefixes(fake: FakeTelegram) -> None:
    assert inbound(upd(fake, fake.private_message(42, "hi")), allow_from=("tg:42",)).user_id == "42"


# -- groups --------------------------------------------------------------------------------------


def test_group_with_mention_is_accepted_and_mention_stripped(fake: FakeTelegram) -> None:
    msg = fake.group_message(-1001, 42, "@botd_test_bot what is up?")
    got = inbound(upd(fake, msg), groups=("-1001",))
    assert (got.scope, got.chat_id, got.text, got.chat_type) == ("group", "-1001", "what is up?", "supergroup")


def test_group_without_mention_is_ignored(fake: FakeTelegram) -> None:
    got = ignored(upd(fake, fake.group_message(-1001, 42, "just chatting")), groups=("-1001",))
    assert not got.unauthorized


def test_group_without_mention_accepted_when_not_required(fake: FakeTelegram) -> None:
    got = inbound(upd(fake, fake.group_message(-1001, 42, "just chatting")), groups=("-1001",), require_mention=False)
    assert got.text == "just chatting"


def test_unlisted_group_is_unauthorized(fake: FakeTelegram) -> None:
    got = ignored(upd(fake, fake.group_message(-1002, 42, "@botd_test_bot hi")), groups=("-1001",))
    assert got.unauthorized and got.chat_id == "-1002"


def test_wildcard_group_admits_any_group(fake: FakeTelegram) -> None:
    assert inbound(upd(fake, fake.group_message(-1777, 42, "@botd_test_bot hi")), groups=("*",)).chat_id == "-1777"


def test_group_members_are_marked_listed_only_when_the_allowlist_names_them(fake: FakeTelegram) -> None:
    msg = lambda user: upd(fake, fake.group_message(-1001, user, "/model gpt-4o"))  # noqa: E731
    assert inbound(msg(42), groups=("-1001",), allow_from=("42",)).listed
    assert not inbound(msg(43), groups=("-1001",), allow_from=("42",)).listed
    assert inbound(msg(43), groups=("-1001",)).listed  # no allowlist: the group admits its members
    assert inbound(upd(fake, fake.private_message(42, "/model")), allow_from=("42",)).listed


def test_mention_of_another_bot_is_not_a_mention(fake: FakeTelegram) -> None:
    ignored(upd(fake, fake.group_message(-1001, 42, "@other_bot hi")), groups=("*",))


def test_text_mention_of_the_bot(fake: FakeTelegram) -> None:
    text = "botd please help"
    entity = {"type": "text_mention", "offset": 0, "length": 4, "user": fake.user(ME.id, "botd", is_bot=True)}
    msg = fake.group_message(-1001, 42, text, entities=[entity])
    assert inbound(upd(fake, msg), groups=("*",)).text == "please help"


def test_command_with_bot_name_is_addressed_and_cleaned(fake: FakeTelegram) -> None:
    got = inbound(upd(fake, fake.group_message(-1001, 42, "/status@botd_test_bot")), groups=("*",))
    assert got.text == "/status"


def test_command_for_another_bot_is_ignored(fake: FakeTelegram) -> None:
    ignored(upd(fake, fake.group_message(-1001, 42, "/status@other_bot")), groups=("*",))


def test_bare_own_command_at_start_is_addressed(fake: FakeTelegram) -> None:
    assert inbound(upd(fake, fake.group_message(-1001, 42, "/stop")), groups=("*",)).text == "/stop"
    ignored(upd(fake, fake.group_message(-1001, 42, "/weather")), groups=("*",))


def test_approve_command_keeps_its_argument(fake: FakeTelegram) -> None:
    got = inbound(upd(fake, fake.group_message(-1001, 42, "/approve@botd_test_bot abc123")), groups=("*",))
    assert got.text == "/approve abc123"


def test_reply_to_bot_message_is_addressed(fake: FakeTelegram) -> None:
    bot_msg = fake.message(fake.chat(-1001), fake.bot_user, "I am the bot")
    msg = fake.group_message(-1001, 42, "thanks!", reply_to=bot_msg["message_id"])
    assert inbound(upd(fake, msg), groups=("*",)).text == "thanks!"


def test_reply_to_a_person_is_not_addressed(fake: FakeTelegram) -> None:
    other = fake.group_message(-1001, 7, "hello")
    ignored(upd(fake, fake.group_message(-1001, 42, "hi", reply_to=other["message_id"])), groups=("*",))


def test_mention_with_utf16_offsets_is_stripped(fake: FakeTelegram) -> None:
    msg = fake.group_message(-1001, 42, "😀😀 @botd_test_bot go")
    assert inbound(upd(fake, msg), groups=("*",)).text == "😀😀 go"


def test_only_a_mention_is_empty(fake: FakeTelegram) -> None:
    got = ignored(upd(fake, fake.group_message(-1001, 42, "@botd_test_bot")), groups=("*",))
    assert "empty" in got.reason


# -- topics ---------------------------------------------------------------------------------------


def test_forum_topic_message_keeps_topic(fake: FakeTelegram) -> None:
    msg = fake.group_message(-1003, 42, "@botd_test_bot in topic", forum=True, topic_id=77)
    got = inbound(upd(fake, msg), groups=("*",))
    assert got.topic_id == "77" and got.is_forum


def test_topic_creation_reply_does_not_count_as_reply_to_bot(fake: FakeTelegram) -> None:
    # In a topic every message "replies" to the topic's creation message; that is no mention.
    msg = fake.group_message(-1003, 42, "no mention here", forum=True, topic_id=77)
    msg["reply_to_message"]["from"] = fake.bot_user
    ignored(upd(fake, msg), groups=("*",))


def test_general_topic_has_no_topic(fake: FakeTelegram) -> None:
    msg = fake.group_message(-1003, 42, "@botd_test_bot in general", forum=True)
    got = inbound(upd(fake, msg), groups=("*",))
    assert got.topic_id is None and got.is_forum


def test_reply_thread_in_plain_supergroup_is_not_a_topic(fake: FakeTelegram) -> None:
    root = fake.group_message(-1004, 7, "root")
    msg = fake.group_message(-1004, 42, "@botd_test_bot re", reply_to=root["message_id"])
    assert msg["message_thread_id"] == root["message_id"]
    assert inbound(upd(fake, msg), groups=("*",)).topic_id is None


# -- content ---------------------------------------------------------------------------------------


def test_photo_with_caption(fake: FakeTelegram) -> None:
    photo = {"photo": [{"file_id": "p1", "file_unique_id": "u1", "width": 90, "height": 90}]}
    msg = fake.private_message(42, None, caption="look at this", media=photo)
    got = inbound(upd(fake, msg), allow_from=("42",))
    assert got.text == "look at this"  # the caption is the text; the photo is an attachment
    assert got.attachments == (Attachment(kind="photo", file_id="p1", name="photo.jpg", mime="image/jpeg"),)


def test_caption_mention_in_group(fake: FakeTelegram) -> None:
    photo = {"photo": [{"file_id": "p1", "file_unique_id": "u1", "width": 90, "height": 90}]}
    msg = fake.group_message(-1001, 42, None, caption="@botd_test_bot what is this", media=photo)
    assert inbound(upd(fake, msg), groups=("*",)).text == "what is this"


@pytest.mark.parametrize(
    ("media", "expected"),
    [
        ({"location": {"latitude": 52.5, "longitude": 13.4}}, "[location: 52.50000, 13.40000]"),
        ({"animation": {"file_id": "a", "file_unique_id": "a", "width": 1, "height": 1, "duration": 1},
          "document": {"file_id": "a", "file_unique_id": "a"}}, "[animation]"),
    ],
)
def test_media_placeholders(fake: FakeTelegram, media: dict[str, Any], expected: str) -> None:
    msg = fake.private_message(42, None, media=media)
    got = inbound(upd(fake, msg), allow_from=("42",))
    assert (got.text, got.attachments) == (expected, ())


_STICKER = {"file_id": "s", "file_unique_id": "s", "type": "regular", "width": 1, "height": 1, "emoji": "😀"}


@pytest.mark.parametrize(
    ("media", "expected"),
    [
        ({"voice": {"file_id": "v", "file_unique_id": "v", "duration": 3}},
         Attachment(kind="voice", file_id="v", name="voice.ogg", mime="audio/ogg")),
        ({"document": {"file_id": "d", "file_unique_id": "d", "file_name": "report.pdf", "file_size": 7}},
         Attachment(kind="document", file_id="d", name="report.pdf", size=7)),
        ({"sticker": {**_STICKER, "is_animated": False, "is_video": False}},
         Attachment(kind="sticker", file_id="s", name="sticker😀.webp", mime="image/webp")),
        ({"sticker": {**_STICKER, "is_animated": True, "is_video": False,
                      "thumbnail": {"file_id": "t", "file_unique_id": "t", "width": 1, "height": 1}}},
         Attachment(kind="sticker", file_id="t", name="sticker😀.webp", mime="image/webp")),
    ],
)
def test_files_become_attachments_without_a_placeholder(
    fake: FakeTelegram, media: dict[str, Any], expected: Attachment
) -> None:
    got = inbound(upd(fake, fake.private_message(42, None, media=media)), allow_from=("42",))
    assert (got.text, got.attachments, got.media_group) == ("", (expected,), None)


def test_album_items_carry_their_media_group(fake: FakeTelegram) -> None:
    photo = {"photo": [{"file_id": "small", "file_unique_id": "a", "width": 90, "height": 60, "file_size": 900},
                       {"file_id": "large", "file_unique_id": "b", "width": 1280, "height": 853, "file_size": 90000}]}
    msg = fake.private_message(42, None, media=photo, extra={"media_group_id": "777"})
    got = inbound(upd(fake, msg), allow_from=("42",))
    assert got.media_group == "777" and [a.file_id for a in got.attachments] == ["large"]


def test_animated_sticker_without_thumbnail_stays_a_placeholder(fake: FakeTelegram) -> None:
    media = {"sticker": {**_STICKER, "is_animated": True, "is_video": False}}
    got = inbound(upd(fake, fake.private_message(42, None, media=media)), allow_from=("42",))
    assert (got.text, got.attachments) == ("[sticker 😀]", ())


def test_bot_senders_are_ignored(fake: FakeTelegram) -> None:
    msg = fake.message(fake.chat(-1001), fake.user(555, "Other", is_bot=True, username="other_bot"), "@botd_test_bot hi")
    assert "bot" in ignored(upd(fake, msg), groups=("*",)).reason


def test_anonymous_admin_is_ignored(fake: FakeTelegram) -> None:
    msg = fake.group_message(-1001, 42, "@botd_test_bot hi", extra={"sender_chat": fake.chat(-1001)})
    ignored(upd(fake, msg), groups=("*",))


def test_edited_message_is_ignored(fake: FakeTelegram) -> None:
    msg = fake.private_message(42, "edited", extra={"edit_date": 1})
    assert ignored(upd(fake, msg, kind="edited_message"), allow_from=("42",)).reason == "edited message"


def test_channel_post_is_ignored(fake: FakeTelegram) -> None:
    chat = fake.chat(-1009, kind="channel")
    post = {"message_id": 1, "chat": chat, "date": 1, "text": "news"}
    assert ignored({"update_id": 5, "channel_post": post}, groups=("*",)).reason == "channel post"


def test_service_message_is_ignored(fake: FakeTelegram) -> None:
    msg = fake.group_message(-1001, 42, None, extra={"new_chat_members": [fake.user(9, "New")]})
    assert ignored(upd(fake, msg), groups=("*",), require_mention=False).reason == "service message"


# -- approval buttons ---------------------------------------------------------------------------------


def _approval_message(fake: FakeTelegram, chat_id: int) -> dict[str, Any]:
    return fake.message(fake.chat(chat_id), fake.bot_user, "Approval needed")


def test_callback_from_allowed_user_becomes_approve_command(fake: FakeTelegram) -> None:
    approval = _approval_message(fake, 42)
    update = {"update_id": 9, **fake.callback_update(fake.user(42, "Ann"), approval, "ap:abc123:y")}
    got = inbound(update, allow_from=("42",))
    assert (got.text, got.scope, got.chat_id, got.decision) == ("/approve abc123", "dm", "42", "approve")
    assert got.callback_id and got.message_id == str(approval["message_id"])


def test_callback_deny(fake: FakeTelegram) -> None:
    update = {"update_id": 9, **fake.callback_update(fake.user(42, "Ann"), _approval_message(fake, -1001), "ap:abc:n")}
    got = inbound(update, allow_from=("42",), groups=("-1001",))
    assert (got.text, got.scope, got.chat_id) == ("/deny abc", "group", "-1001")


def test_callback_from_stranger_is_rejected(fake: FakeTelegram) -> None:
    update = {"update_id": 9, **fake.callback_update(fake.user(66, "Eve"), _approval_message(fake, -1001), "ap:abc:y")}
    got = ignored(update, allow_from=("42",), groups=("*",))
    assert got.unauthorized and got.callback_id


def test_callback_with_unknown_data(fake: FakeTelegram) -> None:
    update = {"update_id": 9, **fake.callback_update(fake.user(42, "Ann"), _approval_message(fake, 42), "zz")}
    got = ignored(update, allow_from=("42",))
    assert got.reason == "unknown button" and got.callback_id


# -- settings -------------------------------------------------------------------------------------------


def test_settings_validation_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="telegram.token"):
        TelegramSettings(token="nocolon")
    with pytest.raises(ValueError, match="telegram.webhook_secret"):
        TelegramSettings(token=TOKEN, webhook_secret="bad secret!")


def test_settings_hide_secrets_and_derive_webhook_secret() -> None:
    s = TelegramSettings(token=TOKEN, mode="webhook", webhook_url="https://x/telegram")
    assert TOKEN not in repr(s)
    secret = s.effective_webhook_secret
    assert len(secret) == 64 and secret == TelegramSettings(token=TOKEN).effective_webhook_secret
    assert TOKEN.split(":")[1] not in secret


def test_settings_from_config_reveals_secret_values() -> None:
    class Secret:
        def __init__(self, v: str) -> None:
            self.v = v

        def get_secret_value(self) -> str:
            return self.v

    class Section:
        token = Secret(TOKEN)
        api_base_url = None
        mode = "polling"
        webhook_url = None
        webhook_secret = None
        webhook_path = "/telegram"
        dm_policy = "open"
        allow_from = [42, "@ann"]
        groups = [-1001]
        require_mention = True
        stream_edit_interval_s = 1.5

    s = TelegramSettings.from_config(Section())
    assert s.token == TOKEN and s.allow_from == ("42", "@ann") and s.groups == ("-1001",) and s.bot_id == "123456789"


def test_channel_satisfies_the_adapter_protocol() -> None:
    from channels.base import ChannelAdapter
    from channels.telegram import TelegramChannel

    channel = TelegramChannel(settings())
    assert isinstance(channel, ChannelAdapter)
    assert channel.name == "telegram" and not channel.is_ready()
