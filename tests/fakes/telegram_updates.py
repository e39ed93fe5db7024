"""Building inbound Telegram traffic as the Bot API delivers it (users, chats, messages, buttons).

Mixed into the fake server so built messages are also stored and can be replied to,
edited or reacted to. Entities for ``@mentions`` and ``/commands`` are computed the way
Telegram does, with UTF-16 offsets; forum topics and reply threads carry the same
``message_thread_id`` / ``is_topic_message`` / ``reply_to_message`` shapes as real ones.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

_MENTION = re.compile(r"(?<![\w@])@[A-Za-z][A-Za-z0-9_]{3,31}")
_COMMAND = re.compile(r"(?<![\w/])/[A-Za-z0-9_]{1,32}(?:@[A-Za-z][A-Za-z0-9_]{3,31})?")


@dataclass
class SentMessage:
    """A message as the fake stores it (bot's own or a user's)."""

    chat_id: int
    message_id: int
    text: str  # visible text
    raw: str  # text as sent (HTML when parse_mode is HTML)
    parse_mode: str | None
    thread_id: int | None
    reply_to: int | None
    reply_markup: dict[str, Any] | None
    from_bot: bool
    data: dict[str, Any]
    deleted: bool = False
    edits: int = 0


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def auto_entities(text: str) -> list[dict[str, Any]]:
    """Entities Telegram would attach: mentions and bot commands, UTF-16 offsets."""
    found: list[dict[str, Any]] = []
    for kind, pattern in (("mention", _MENTION), ("bot_command", _COMMAND)):
        for m in pattern.finditer(text):
            found.append(
                {"type": kind, "offset": utf16_len(text[: m.start()]), "length": utf16_len(m.group())}
            )
    return sorted(found, key=lambda e: e["offset"])


class UpdateBuilder:
    """Builders for users, chats, messages and callback queries (state lives on the server)."""

    bot_id: int
    chats: dict[int, dict[str, Any]]
    messages: dict[tuple[int, int], SentMessage]
    _next_message_id: dict[int, int]
    _next_callback: int

    @property
    def bot_user(self) -> dict[str, Any]:
        raise NotImplementedError

    def chat(self, chat_id: int, *, kind: str | None = None, title: str | None = None, forum: bool = False,
             username: str | None = None) -> dict[str, Any]:
        """Register (or fetch) a chat; positive ids are private chats, negative ones groups."""
        if chat_id in self.chats and kind is None:
            return self.chats[chat_id]
        kind = kind or ("private" if chat_id > 0 else "supergroup")
        data: dict[str, Any] = {"id": chat_id, "type": kind}
        if kind == "private":
            data["first_name"] = title or f"User{chat_id}"
        else:
            data["title"] = title or f"Group {chat_id}"
        if forum:
            data["is_forum"] = True
        if username:
            data["username"] = username
        self.chats[chat_id] = data
        return data

    @staticmethod
    def user(user_id: int, first_name: str = "Ann", *, username: str | None = None, is_bot: bool = False,
             last_name: str | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {"id": user_id, "is_bot": is_bot, "first_name": first_name}
        if last_name:
            data["last_name"] = last_name
        if username:
            data["username"] = username
        return data

    def _message_id(self, chat_id: int) -> int:
        self._next_message_id[chat_id] = self._next_message_id.get(chat_id, 100) + 1
        return self._next_message_id[chat_id]

    def message(
        self,
        chat: dict[str, Any],
        sender: dict[str, Any],
        text: str | None = None,
        *,
        caption: str | None = None,
        media: dict[str, Any] | None = None,
        topic_id: int | None = None,
        reply_to: int | None = None,
        entities: list[dict[str, Any]] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A user message as Telegram delivers it (stored, so it can be replied to)."""
        chat_id = int(chat["id"])
        msg: dict[str, Any] = {
            "message_id": self._message_id(chat_id),
            "from": sender,
            "chat": chat,
            "date": int(time.time()),
        }
        if text is not None:
            msg["text"] = text
            ents = auto_entities(text) + list(entities or [])
            if ents:
                msg["entities"] = sorted(ents, key=lambda e: e["offset"])
        if caption is not None:
            msg["caption"] = caption
            ents = auto_entities(caption) + list(entities or [])
            if ents:
                msg["caption_entities"] = sorted(ents, key=lambda e: e["offset"])
        if media:
            msg.update(media)
        if topic_id is not None:
            msg["message_thread_id"] = topic_id
            msg["is_topic_message"] = True
        if reply_to is not None:
            replied = self.messages.get((chat_id, reply_to))
            msg["reply_to_message"] = replied.data if replied else {
                "message_id": reply_to, "chat": chat, "date": int(time.time()),
            }
            if topic_id is None and chat.get("type") == "supergroup" and not chat.get("is_forum"):
                msg["message_thread_id"] = reply_to  # reply threads carry an id but are no topic
        elif topic_id is not None:
            # In a forum topic, a non-reply points at the topic's creation service message.
            msg["reply_to_message"] = {
                "message_id": topic_id, "from": self.user(1, "Creator"), "chat": chat, "date": int(time.time()),
                "message_thread_id": topic_id, "forum_topic_created": {"name": "Topic", "icon_color": 7322096},
                "is_topic_message": True,
            }
        if extra:
            msg.update(extra)
        self.messages[(chat_id, msg["message_id"])] = SentMessage(
            chat_id, msg["message_id"], text or caption or "", text or caption or "", None, topic_id, reply_to,
            None, bool(sender.get("is_bot")) and sender.get("id") == self.bot_id, msg,
        )
        return msg

    def private_message(self, user_id: int, text: str | None = None, *, username: str | None = None,
                        first_name: str = "Ann", **kw: Any) -> dict[str, Any]:
        chat = self.chat(user_id, kind="private", title=first_name)
        if username:
            chat["username"] = username
        return self.message(chat, self.user(user_id, first_name, username=username), text, **kw)

    def group_message(self, chat_id: int, user_id: int, text: str | None = None, *, forum: bool = False,
                      kind: str = "supergroup", username: str | None = None, first_name: str = "Ann",
                      **kw: Any) -> dict[str, Any]:
        chat = self.chat(chat_id, kind=kind, forum=forum)
        return self.message(chat, self.user(user_id, first_name, username=username), text, **kw)

    def callback_update(self, user: dict[str, Any], message: SentMessage | dict[str, Any], data: str) -> dict[str, Any]:
        """A callback_query update for a button on ``message``."""
        self._next_callback += 1
        msg = message.data if isinstance(message, SentMessage) else message
        return {"callback_query": {
            "id": str(self._next_callback), "from": user, "message": msg,
            "chat_instance": f"ci{msg['chat']['id']}", "data": data,
        }}
