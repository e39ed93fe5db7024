"""What a live preview may show of a reply still being written.

The final text goes through sanitize and the silent checks; a preview must be at least
as careful while the text is incomplete: a reply that is, or may still become,
NO_REPLY / HEARTBEAT_OK shows nothing, and an unclosed thinking block or a half-written
tag is cut off.
"""

from __future__ import annotations

import re

from agent.sanitize import is_silent_chat, sanitize

# Bounded attribute run: a tag longer than that is not a thinking tag, and no scan restarts
# can make this quadratic on hostile streamed text.
_OPEN_THINKING = re.compile(r"<(redacted_thinking|thinking|think|thought|antthinking)\b[^<>]{0,200}>", re.IGNORECASE)
_NAMES = ("redacted_thinking", "thinking", "think", "thought", "antthinking")
_WRAPPERS = " \t\r\n_.,:;!?\"'`*~#>-()[]{}"
_SILENT_TOKENS = ("NO_REPLY", "HEARTBEAT_OK")


def _cut_unclosed_thinking(text: str) -> str:
    lowered = text.lower()
    last_close = {name: lowered.rfind(f"</{name}") for name in _NAMES}
    for match in _OPEN_THINKING.finditer(text):
        if last_close[match.group(1).lower()] < match.end():
            return text[: match.start()]
    return text


def _cut_partial_tag(text: str) -> str:
    tail_start = max(0, len(text) - 40)
    lt = text.rfind("<", tail_start)
    if lt != -1 and ">" not in text[lt:]:
        return text[:lt]
    return text


def preview_text(raw: str) -> str | None:
    """The text to show for ``raw`` so far, or None when nothing may be shown yet."""
    text = sanitize(_cut_partial_tag(_cut_unclosed_thinking(raw)))
    core = text.strip(_WRAPPERS)
    if not core:
        return None
    upper = core.upper()
    for token in _SILENT_TOKENS:
        if upper.startswith(token) or token.startswith(upper):
            return None
    if is_silent_chat(text):
        return None
    return text
