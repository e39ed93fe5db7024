"""Slack's inbound message text to the plain text the model reads.

Slack escapes ``& < >`` and wraps mentions and links in ``<…>``; the model should see
``@here``, ``#general`` and bare URLs instead, and never the bot's own mention.
"""

from __future__ import annotations

import re

_ANGLE = re.compile(r"<([^<>]*)>")
_SPECIAL = {"here": "@here", "channel": "@channel", "everyone": "@everyone"}


def strip_mention(text: str, bot_user_id: str) -> tuple[str, bool]:
    """Remove every ``<@BOT>`` / ``<@BOT|name>`` from ``text``; also tell whether there was one."""
    if not bot_user_id:
        return text.strip(), False
    pattern = re.compile(r"\s*<@" + re.escape(bot_user_id) + r"(?:\|[^>]*)?>\s*")
    stripped, count = pattern.subn(" ", text)
    return stripped.strip(), count > 0


def _angle(match: re.Match[str]) -> str:
    inner = match.group(1)
    target, _, label = inner.partition("|")
    if target.startswith("@"):
        return "@" + (label or target[1:])
    if target.startswith("#"):
        return "#" + (label or target[1:])
    if target.startswith("!"):
        name = target[1:]
        if name in _SPECIAL:
            return _SPECIAL[name]
        if name.startswith("subteam^"):
            return label or "@" + name.removeprefix("subteam^")
        return label or name
    if not label:
        return target
    bare = re.sub(r"^(?:https?://|mailto:)", "", target)
    return target if label in (target, bare) else f"{label} ({target})"


def to_plain(text: str) -> str:
    """Resolve Slack's ``<…>`` markup and unescape ``&amp; &lt; &gt;``."""
    resolved = _ANGLE.sub(_angle, text)
    return resolved.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
