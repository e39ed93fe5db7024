"""Control commands: recognised in any channel, handled at once, never queued."""

from __future__ import annotations

import re
from dataclasses import dataclass

COMMANDS: tuple[tuple[str, str], ...] = (
    ("stop", "Stop the current run"),
    ("stopall", "Stop the current run and drop queued messages"),
    ("new", "Start a fresh session"),
    ("status", "Show model, tokens, queue and active run"),
    ("help", "List the commands"),
)

HELP_TEXT = (
    "Commands:\n"
    "/stop — stop the current run\n"
    "/stopall — stop the current run and drop queued messages\n"
    "/new — start a fresh session\n"
    "/status — model, tokens, queue and active run\n"
    "/approve ID, /deny ID — answer a tool approval request\n"
    "/help — this list"
)

_COMMAND = re.compile(r"^/(stop|stopall|new|reset|status|help|approve|deny)(?:@[A-Za-z0-9_]+)?(?:\s+(\S+))?\s*$", re.I)


@dataclass(frozen=True)
class Command:
    name: str
    arg: str | None = None


def parse_command(text: str) -> Command | None:
    """The control command in ``text``, or None when it is an ordinary message."""
    match = _COMMAND.match(text.strip())
    if match is None:
        return None
    name = match.group(1).lower()
    if name == "reset":
        name = "new"
    arg = match.group(2)
    if name in ("approve", "deny") and not arg:
        return None
    if name not in ("approve", "deny") and arg:
        return None
    return Command(name, arg)
