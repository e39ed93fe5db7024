"""Turn Telegram updates into inbound chat messages, deciding who may talk to the bot.

Pure functions over python-telegram-bot objects (no I/O), so every rule is unit-testable:

* only new messages count: edits, channel posts, service messages and messages from
  bots (including anonymous group admins) are ignored;
* private chats follow ``dm_policy`` (``allowlist``: only ``allow_from``, empty admits
  nobody; ``open``: anyone; ``pairing``: like allowlist, and the adapter lists users
  approved by pairing through :meth:`Access.with_user`); groups must be listed in ``groups`` (chat id, ``@name`` or
  ``*``) and, unless ``require_mention`` is off, address the bot: an ``@botname``
  mention, a text mention of the bot user, ``/cmd@botname``, one of the bot's own
  commands at the start, or a reply to one of the bot's messages;
* the bot's own mention is removed from the text; photos, documents, audio, voice,
  video, video notes and stickers become attachments (the caption is the text; an
  album's items carry its ``media_group_id``), other media short placeholders;
* forum topics keep their thread, the General topic and reply threads do not.

python-telegram-bot checks no types when it builds an ``Update`` from JSON, so an update
that lacks what the Bot API guarantees (a message without a chat, a list for a text)
can reach these functions; :func:`normalize_update` raises :class:`MalformedUpdate` for
it, and nothing else.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from telegram import CallbackQuery, Chat, Message, MessageEntity, Update, User

from agent.types import Attachment
from channels.telegram.media import message_attachments, message_body
from channels.telegram.settings import TelegramSettings

DM_NOT_ALLOWED = "sender not allowed"
CONTROL_COMMANDS = frozenset(
    {"stop", "stopall", "new", "status", "help", "approve", "deny", "compact", "model", "usage"}
)
NOT_ADDRESSED = "group message not addressed to the bot"
APPROVAL_DATA = re.compile(r"^ap:([A-Za-z0-9_-]{1,48}):([yn])$")


class MalformedUpdate(ValueError):
    """An update that does not have the shape the Bot API guarantees."""


@dataclass(frozen=True)
class BotIdentity:
    """Who the bot is (from getMe)."""

    id: int
    username: str


@dataclass(frozen=True)
class Inbound:
    """A message (or an approval button press) to submit."""

    update_id: int
    scope: Literal["dm", "group"]
    chat_id: str
    chat_type: str
    is_forum: bool
    topic_id: str | None
    user_id: str
    user_name: str
    username: str | None
    text: str
    message_id: str | None
    callback_id: str | None = None
    decision: Literal["approve", "deny"] | None = None
    # The sender passes the strict check approvals use (listed, when there is an allowlist);
    # a group admits every member, but only listed users may change what the bot costs (/model).
    listed: bool = True
    attachments: tuple[Attachment, ...] = ()
    media_group: str | None = None


@dataclass(frozen=True)
class Ignored:
    """Why an update leads to nothing; ``unauthorized`` ones are logged at info."""

    reason: str
    unauthorized: bool = False
    user_id: str | None = None
    chat_id: str | None = None
    callback_id: str | None = None


class Access:
    """The allowlists of the settings, normalized once."""

    def __init__(self, settings: TelegramSettings) -> None:
        self.dm_open = settings.dm_policy == "open"
        self.user_ids, self.usernames = _split_ids(settings.allow_from)
        group_ids, group_names = _split_ids(settings.groups)
        self.any_group = "*" in (g.strip() for g in settings.groups)
        self.group_ids, self.group_names = group_ids, group_names
        self.require_mention = settings.require_mention

    def with_user(self, user_id: str) -> Access:
        """This access with one more listed user (one approved by pairing)."""
        widened = copy.copy(self)
        widened.user_ids = self.user_ids | {user_id}
        return widened

    def user_listed(self, user: User) -> bool:
        return self.user_listed_id(str(user.id), user.username)

    def user_listed_id(self, user_id: str, username: str | None) -> bool:
        return user_id in self.user_ids or (username or "").lower() in self.usernames

    def dm_allowed(self, user: User) -> bool:
        return self.dm_open or self.user_listed(user)

    def group_allowed(self, chat: Chat) -> bool:
        return self.any_group or str(chat.id) in self.group_ids or (chat.username or "").lower() in self.group_names

    def approver_allowed(self, user: User, chat: Chat) -> bool:
        """Approvals are stricter: with an allowlist, only listed users may approve anywhere."""
        if self.user_ids or self.usernames:
            return self.user_listed(user)
        if chat.type == Chat.PRIVATE:
            return self.dm_open
        return self.group_allowed(chat)


def _split_ids(entries: Iterable[str]) -> tuple[frozenset[str], frozenset[str]]:
    ids: set[str] = set()
    names: set[str] = set()
    for raw in entries:
        entry = str(raw).strip()
        for prefix in ("telegram:", "tg:"):
            if entry.lower().startswith(prefix):
                entry = entry[len(prefix):]
        if not entry or entry == "*":
            continue
        if re.fullmatch(r"-?\d+", entry):
            ids.add(entry)
        else:
            names.add(entry.lstrip("@").lower())
    return frozenset(ids), frozenset(names)


def normalize_update(
    update: Update,
    me: BotIdentity,
    access: Access,
    commands: frozenset[str] = CONTROL_COMMANDS,
    *,
    addressed: bool = False,
) -> Inbound | Ignored:
    """Decide what an update means for the bot; raises only :class:`MalformedUpdate`.

    ``addressed``: the caller knows the message is meant for the bot (the rest of an
    album whose first item mentioned it)."""
    try:
        return _normalize_update(update, me, access, commands, addressed)
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
        raise MalformedUpdate(f"malformed update ({type(exc).__name__}: {exc})") from exc


def _normalize_update(
    update: Update, me: BotIdentity, access: Access, commands: frozenset[str], addressed: bool
) -> Inbound | Ignored:
    if update.callback_query is not None:
        return normalize_callback(update.update_id, update.callback_query, access)
    if update.edited_message is not None or update.edited_channel_post is not None:
        return Ignored("edited message")
    if update.channel_post is not None:
        return Ignored("channel post")
    msg = update.message
    if msg is None:
        return Ignored("unsupported update type")
    return normalize_message(update.update_id, msg, me, access, commands, addressed=addressed)


def normalize_message(
    update_id: int,
    msg: Message,
    me: BotIdentity,
    access: Access,
    commands: frozenset[str] = CONTROL_COMMANDS,
    *,
    addressed: bool = False,
) -> Inbound | Ignored:
    user, chat = msg.from_user, msg.chat
    if user is None or user.is_bot or msg.sender_chat is not None:
        return Ignored("sent by a bot or on behalf of a chat", chat_id=str(chat.id))
    if chat.type == Chat.CHANNEL:
        return Ignored("channel post", chat_id=str(chat.id))
    attachments = message_attachments(msg)
    caption = msg.text if msg.text is not None else msg.caption
    body = (caption or "") if attachments else message_body(msg)
    if body is None:
        return Ignored("service message", user_id=str(user.id), chat_id=str(chat.id))
    if chat.type == Chat.PRIVATE:
        if not access.dm_allowed(user):
            return Ignored(DM_NOT_ALLOWED, unauthorized=True, user_id=str(user.id), chat_id=str(chat.id))
        scope: Literal["dm", "group"] = "dm"
        chat_id = str(user.id)
    else:
        addressed = addressed or addresses_bot(msg, me, commands)
        if access.require_mention and not addressed:
            return Ignored(NOT_ADDRESSED, user_id=str(user.id), chat_id=str(chat.id))
        if not access.group_allowed(chat):
            return Ignored("group not allowed", unauthorized=True, user_id=str(user.id), chat_id=str(chat.id))
        scope, chat_id = "group", str(chat.id)
    text = strip_bot_mention(msg, body, me)
    if not text and not attachments:
        return Ignored("empty after removing the mention", user_id=str(user.id), chat_id=chat_id)
    is_forum = bool(chat.is_forum)
    topic = str(msg.message_thread_id) if is_forum and msg.is_topic_message and msg.message_thread_id else None
    return Inbound(
        update_id=update_id,
        scope=scope,
        chat_id=chat_id,
        chat_type=chat.type,
        is_forum=is_forum,
        topic_id=topic,
        user_id=str(user.id),
        user_name=display_name(user),
        username=user.username,
        text=text,
        message_id=str(msg.message_id),
        listed=access.approver_allowed(user, chat),
        attachments=tuple(attachments),
        media_group=msg.media_group_id if attachments and msg.media_group_id else None,
    )


def normalize_callback(update_id: int, query: CallbackQuery, access: Access) -> Inbound | Ignored:
    """An approval button press (``ap:<id>:y|n``) from someone allowed to approve."""
    user = query.from_user
    match = APPROVAL_DATA.match(query.data or "")
    msg = query.message
    if match is None or msg is None:
        return Ignored("unknown button", user_id=str(user.id), callback_id=query.id)
    chat = msg.chat
    if user.is_bot or not access.approver_allowed(user, chat):
        return Ignored(
            "approver not allowed", unauthorized=True, user_id=str(user.id), chat_id=str(chat.id), callback_id=query.id
        )
    approval_id, answer = match.group(1), match.group(2)
    private = chat.type == Chat.PRIVATE
    is_forum = bool(chat.is_forum)
    topic = None
    if isinstance(msg, Message) and is_forum and msg.is_topic_message and msg.message_thread_id:
        topic = str(msg.message_thread_id)
    decision: Literal["approve", "deny"] = "approve" if answer == "y" else "deny"
    return Inbound(
        update_id=update_id,
        scope="dm" if private else "group",
        chat_id=str(user.id) if private else str(chat.id),
        chat_type=chat.type,
        is_forum=is_forum,
        topic_id=topic,
        user_id=str(user.id),
        user_name=display_name(user),
        username=user.username,
        text=f"/{decision} {approval_id}",
        message_id=str(msg.message_id),  # replies to the decision go under the approval message
        callback_id=query.id,
        decision=decision,
    )


def display_name(user: User) -> str:
    name = " ".join(p for p in (user.first_name, user.last_name) if p)
    return name or (user.username or str(user.id))


def _entities(msg: Message) -> dict[MessageEntity, str]:
    return msg.parse_entities() if msg.text is not None else msg.parse_caption_entities()


def _is_bot_mention(entity: MessageEntity, text: str, me: BotIdentity) -> bool:
    if entity.type == MessageEntity.MENTION:
        return text.lower() == "@" + me.username.lower()
    return entity.type == MessageEntity.TEXT_MENTION and entity.user is not None and entity.user.id == me.id


def addresses_bot(msg: Message, me: BotIdentity, commands: frozenset[str] = CONTROL_COMMANDS) -> bool:
    """Whether a group message is meant for the bot (see the module docstring)."""
    for entity, text in _entities(msg).items():
        if _is_bot_mention(entity, text, me):
            return True
        if entity.type == MessageEntity.BOT_COMMAND:
            name, _, target = text.lstrip("/").partition("@")
            if target.lower() == me.username.lower():
                return True
            if not target and entity.offset == 0 and name.lower() in commands:
                return True
    replied = msg.reply_to_message
    return bool(
        replied is not None
        and replied.forum_topic_created is None
        and replied.from_user is not None
        and replied.from_user.id == me.id
    )


def strip_bot_mention(msg: Message, body: str, me: BotIdentity) -> str:
    """Remove ``@botname`` and text mentions of the bot; ``/cmd@botname`` becomes ``/cmd``."""
    source = msg.text if msg.text is not None else msg.caption
    if not source:
        return body.strip()
    prefix = body[: len(body) - len(source)]
    handle = "@" + me.username.lower()
    cuts: list[tuple[int, int, str]] = []
    for entity, text in _entities(msg).items():
        start = _py_index(source, entity.offset)
        end = _py_index(source, entity.offset + entity.length)
        if _is_bot_mention(entity, text, me):
            cuts.append((start, end, ""))
        elif entity.type == MessageEntity.BOT_COMMAND and text.lower().endswith(handle):
            cuts.append((start, end, text[: len(text) - len(handle)]))
    cleaned = source
    for start, end, replacement in sorted(cuts, reverse=True):
        cleaned = cleaned[:start] + replacement + cleaned[end:]
    if cuts:
        cleaned = re.sub(r"[ \t]{2,}", " ", cleaned).strip()
        cleaned = re.sub(r"^[,:;]\s*", "", cleaned)
    return (prefix + cleaned).strip()


def _py_index(text: str, utf16_offset: int) -> int:
    """Convert a UTF-16 offset (as Telegram's entities use) to a Python string index."""
    return len(text.encode("utf-16-le")[: 2 * utf16_offset].decode("utf-16-le", errors="ignore"))
