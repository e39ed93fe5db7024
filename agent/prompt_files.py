"""Workspace files in the system prompt: read tolerantly, capped, fenced and defused.

IDENTITY.md, SOUL.md, MEMORY.md and other context files are written by people
and by the agent itself (memory), so their text is data, not trusted prompt
structure. Each file is wrapped in ``<<<FILE name>>> … <<<END FILE>>>`` markers;
inside, chat-template control tokens (``<|im_start|>``, ``[INST]``, ``<<SYS>>``
…) and anything that looks like our own markers are escaped, so the content
cannot close its fence or open a new chat turn.

Every run reads the same few files, and they seldom change: a file whose ``stat`` is what
it was at its last read is not read (nor fenced) again.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import stat
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Final

MAX_FILE_CHARS: Final[int] = 20_000
END_MARKER: Final[str] = "<<<END FILE>>>"
# The files read before, by path: what fstat said of each as it was read, and its text.
READ_BEFORE_KEPT: Final[int] = 64
# A file changed this recently when it was read is read again next time: a second write
# within the file system's clock tick could keep its size and times (git's "racy" files).
SETTLED_NS: Final[int] = 2_000_000_000

# Control tokens of common chat templates, anything shaped like <|…|> (or DeepSeek's
# full-width <｜…｜>), and a "<<<" that starts a forged FILE / END FILE marker.
# No nested quantifiers: the bodies stop at the next "<", so every scan is linear.
_CONTROL: Final = re.compile(
    r"<\|[^<>|]*+\|>|<｜[^<>｜]*+｜>|\[/?inst\]|<</?sys>>|<<<(?=\s*+(?:end\s++)?file)",
    re.IGNORECASE,
)
_ESCAPES: Final = str.maketrans({"<": "&lt;", ">": "&gt;", "[": "&#91;", "]": "&#93;"})


def neutralize(text: str) -> str:
    """Escape chat-template control tokens and forged file markers in untrusted text."""
    return _CONTROL.sub(lambda m: m.group(0).translate(_ESCAPES), text)


def single_line(text: str, limit: int = 200) -> str:
    """Untrusted short text (a display name) as one neutralized line of at most ``limit`` chars."""
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[:limit] + "…"
    return neutralize(flat)


@dataclass(frozen=True)
class FileText:
    """A workspace file as read for the prompt; ``text`` is None when it is missing or empty."""

    name: str
    text: str | None
    note: str | None = None  # why it is absent or shortened, for the prompt

    @property
    def present(self) -> bool:
        return self.text is not None


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def read_workspace_file(workspace: Path, name: str | Path, *, max_chars: int = MAX_FILE_CHARS) -> FileText:
    """Read ``name`` (relative to ``workspace``) for the prompt, never raising.

    Missing, empty, unreadable, not a regular file (a FIFO must not stall the daemon), or
    resolving outside the workspace (a symlink elsewhere) all give ``text=None``;
    undecodable bytes are replaced; text over ``max_chars`` is cut.
    """
    label = str(name)
    if label not in ("", ".", "..") and "/" not in label:
        # A plain name, not followed if it is a symlink, cannot leave the workspace: no
        # path resolution (several files a run, so not even a Path object). A symlink
        # takes the long way.
        try:
            return _read_again(os.path.join(workspace, label), label, max_chars)
        except _FollowNeeded:
            pass
    try:
        root = workspace.resolve()
        path = (root / name).resolve()
    except (OSError, RuntimeError) as exc:
        return FileText(label, None, f"{label} could not be resolved ({type(exc).__name__})")
    if not _inside(path, root):
        return FileText(label, None, f"{label} is outside the workspace and was not read")
    return _read(path, label, max_chars, 0)[0]


class _FollowNeeded(Exception):
    """The name is a symlink: only the resolving path may decide where it leads."""


_read_before: OrderedDict[str, tuple[tuple[int, ...], FileText]] = OrderedDict()


def _read_again(path: str, label: str, max_chars: int) -> FileText:
    """The plain name's text: from the last read while its stat is unchanged, else read."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        _read_before.pop(path, None)
        return FileText(label, None)
    except OSError:
        info = None  # _read says why
    if info is not None:
        if stat.S_ISLNK(info.st_mode):
            raise _FollowNeeded
        known = _read_before.get(path)
        if known is not None and known[0] == _stamp(info, max_chars):
            _read_before.move_to_end(path)
            return known[1]
    file, read_info = _read(path, label, max_chars, os.O_NOFOLLOW)
    if read_info is None or time.time_ns() - max(read_info.st_mtime_ns, read_info.st_ctime_ns) < SETTLED_NS:
        _read_before.pop(path, None)
    else:
        _read_before[path] = (_stamp(read_info, max_chars), file)
        _read_before.move_to_end(path)
        while len(_read_before) > READ_BEFORE_KEPT:
            _read_before.popitem(last=False)
    return file


def _stamp(info: os.stat_result, max_chars: int) -> tuple[int, ...]:
    """What changes when the file does (a rename over it changes the inode)."""
    return (info.st_dev, info.st_ino, info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns, max_chars)


def _read(path: str | Path, label: str, max_chars: int, flags: int) -> tuple[FileText, os.stat_result | None]:
    """The file's text, and its fstat when it is a regular file that was read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | flags)
    except FileNotFoundError:
        return FileText(label, None), None
    except OSError as exc:
        if flags & os.O_NOFOLLOW and exc.errno == errno.ELOOP:
            raise _FollowNeeded from None
        return FileText(label, None, f"{label} could not be read ({type(exc).__name__})"), None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        if stat.S_ISDIR(info.st_mode):
            return FileText(label, None, f"{label} could not be read (IsADirectoryError)"), None
        return FileText(label, None, f"{label} is not a regular file and was not read"), None
    with open(fd, encoding="utf-8", errors="replace", closefd=True) as handle:
        try:
            text = handle.read(max_chars + 1)
        except OSError as exc:
            return FileText(label, None, f"{label} could not be read ({type(exc).__name__})"), None
    if not text.strip():
        return FileText(label, None), info
    if len(text) > max_chars:
        return FileText(
            label,
            text[:max_chars],
            f"{label} was cut to its first {max_chars} characters (the file is {info.st_size} bytes)",
        ), info
    return FileText(label, text), info


@functools.lru_cache(maxsize=32)  # the same files, read again (the same FileText), run after run
def fenced(file: FileText) -> str:
    """The file's text inside boundary markers, neutralized, with its truncation note."""
    body = neutralize(file.text or "")
    if not body.endswith("\n"):
        body += "\n"
    block = f"<<<FILE {single_line(file.name)}>>>\n{body}{END_MARKER}"
    if file.note:
        block += f"\n[{file.note}]"
    return block
