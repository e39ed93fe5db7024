"""HEARTBEAT.md: the checklist a heartbeat works through, and when it is "empty".

A file that holds only structure (headings, HTML comments, blank lines, horizontal
rules, list bullets or checkboxes with nothing after them) gives the model nothing
to do, so the heartbeat is skipped without an LLM call. A missing file counts as
empty.
"""

from __future__ import annotations

import re
from pathlib import Path

HEARTBEAT_FILE = "HEARTBEAT.md"
MAX_HEARTBEAT_CHARS = 16_000

_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
_HEADING = re.compile(r"^#{1,6}(?:\s.*)?$")
_RULE_OR_UNDERLINE = re.compile(r"^(?:[-=*_]\s*){3,}$|^=+$")
_EMPTY_ITEM = re.compile(r"^(?:[-*+]|\d{1,9}[.)])(?:\s+\[[ xX]?\])?\s*$")
_LIST_ITEM = re.compile(r"^(?:[-*+]|\d{1,9}[.)])\s")
_SETEXT_UNDERLINE = re.compile(r"^(?:=+|-+)$")


def read_heartbeat_file(workspace: Path) -> str:
    """The text of ``<workspace>/HEARTBEAT.md``, or ``""`` when it does not exist."""
    path = workspace / HEARTBEAT_FILE
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    except IsADirectoryError:
        return ""


def is_effectively_empty(text: str) -> bool:
    """True when ``text`` has no actionable line (see the module docstring)."""
    lines = [raw.strip() for raw in _COMMENT.sub("", text).splitlines()]
    for index, line in enumerate(lines):
        if not line:
            continue
        if _HEADING.match(line) or _RULE_OR_UNDERLINE.match(line) or _EMPTY_ITEM.match(line):
            continue
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if _SETEXT_UNDERLINE.match(following) and not _LIST_ITEM.match(line):
            continue  # "Title" underlined with === or --- is a heading
        return False
    return True


def clip_heartbeat_text(text: str, limit: int = MAX_HEARTBEAT_CHARS) -> str:
    """The file content for the prompt, cut with a notice when it is very long."""
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[HEARTBEAT.md truncated: {limit} of {len(text)} characters shown]"
