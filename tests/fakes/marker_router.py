"""A FakeOpenAI responder that picks scripted replies by a marker word.

End-to-end tests share one daemon across tests; each test puts its own marker in its
messages, so the answers it scripts reach only its own requests, in any test order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from tests.fakes.openai_wire import Reply


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the last user message of a chat-completions request body."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def echo(text: str) -> Reply:
    return Reply.text(f"echo: {text}")


class Router:
    """``on(marker, *replies)`` scripts the answers to the requests whose last user
    message contains ``marker``; anything unscripted gets ``default(text)``."""

    def __init__(self, default: Callable[[str], Reply] = echo) -> None:
        self._routes: dict[str, deque[Reply]] = {}
        self._default = default

    def on(self, marker: str, *replies: Reply) -> None:
        self._routes.setdefault(marker, deque()).extend(replies)

    def __call__(self, body: dict[str, Any]) -> Reply:
        text = last_user_text(body)
        for marker, queue in self._routes.items():
            if marker in text and queue:
                return queue.popleft()
        return self._default(text)
