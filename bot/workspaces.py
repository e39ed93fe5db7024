"""Per-user and per-chat workspaces (``agent.workspace_scope``): sessions do not see each other's files.

With ``user`` (the default) a DM's tools work in ``<workspace>/users/<channel>-<user id>/``
and a group's or channel's in ``<workspace>/chats/<channel>-<chat id>/``. That directory
is the tools' working directory and, besides the sandbox's private ``/tmp`` and the
allowed paths outside the workspace, their only writable place; the workspace root
(the agent's own files) is read-only to them, and the other sessions' directories are
masked. Cron and heartbeat runs use the directory of the chat they deliver to: the
user directory when one exists for that chat id (a Telegram DM), else the chat's.
``shared`` keeps one directory for everyone, as before.

Ids become directory names through a reversible escape, so no id can name ``..`` or
another session's directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import stat
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Literal

from agent.tools.registry import ToolSettings
from agent.types import RunRequest

USERS_DIR = "users"
CHATS_DIR = "chats"
# Copied from the workspace root into a new session directory when present there.
SEED_FILES = ("USER.md",)
MAX_SEED_BYTES = 1_048_576
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
# Sessions whose tool settings stay built: enough for every run slot with room to spare.
# Each entry holds its paths; a session past it rebuilds its settings (a mkdir) on its next run.
_CACHE_SIZE = 256


def directory_name(channel: str, ident: str) -> str:
    """``<channel>-<id>`` with every other character escaped as ``.xx`` (hex): never ``..``, never ``/``."""
    return "-".join(_UNSAFE.sub(lambda m: "".join(f".{b:02x}" for b in m.group().encode()), part)
                    for part in (channel, ident))


def session_directory(root: Path, req: RunRequest) -> Path:
    """Where ``req``'s tools work under ``root`` in ``user`` scope."""
    if req.kind == "chat":
        scope = req.session_key.split(":")[3] if req.session_key.count(":") >= 4 else "group"
        if scope == "dm":
            return root / USERS_DIR / directory_name(req.channel, req.user_id or req.chat_id)
        return root / CHATS_DIR / directory_name(req.channel, req.chat_id)
    return delivery_directory(root, req.channel, req.chat_id)


def delivery_directory(root: Path, channel: str, chat_id: str) -> Path:
    """The directory of the chat a scheduled run delivers to: the user's when one exists (a DM)."""
    as_user = root / USERS_DIR / directory_name(channel, chat_id)
    return as_user if as_user.is_dir() else root / CHATS_DIR / directory_name(channel, chat_id)


class SessionWorkspaces:
    """The tool settings of each session's directory, built once per directory."""

    def __init__(self, base: ToolSettings, scope: Literal["user", "shared"]) -> None:
        self.base = base
        self.scope = scope
        self.root = Path(os.path.realpath(base.workspace))
        self._cache: OrderedDict[Path, ToolSettings] = OrderedDict()
        # What every session directory's settings share: built once, not per cached entry.
        self._outside = tuple(p for p in base.allowed_paths if not _within(Path(os.path.realpath(p)), self.root))
        self._readonly = (self.root,)
        self._masked = (*base.masked_paths, self.root / USERS_DIR, self.root / CHATS_DIR)

    def settings_for(self, req: RunRequest) -> ToolSettings:
        if self.scope == "shared":
            return self.base
        directory = session_directory(self.root, req)
        cached = self._cache.get(directory)
        if cached is not None:
            self._cache.move_to_end(directory)
            return cached
        self._prepare(directory)
        settings = dataclasses.replace(
            self.base,
            workspace=directory,
            allowed_paths=(directory, *self._outside),
            readonly_paths=self._readonly,
            masked_paths=self._masked,
        )
        self._cache[directory] = settings
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return settings

    def lookup_dirs(self, channel: str, chat_id: str) -> tuple[Path, ...]:
        """Where a file such as HEARTBEAT.md is looked for on behalf of a chat: its directory, then the root."""
        if self.scope == "shared":
            return (self.root,)
        return (delivery_directory(self.root, channel, chat_id), self.root)

    def _prepare(self, directory: Path) -> None:
        """Create and seed the directory; safe to repeat (after a restart, on another replica)."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name in SEED_FILES:
            _seed(self.root / name, directory / name)


def _seed(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` unless ``target`` exists in any form.

    The session directory is the tools' to write: a link planted at ``target`` must not
    make the daemon write elsewhere, and an existing file (the user's own edits) is never
    replaced. The copy appears whole or not at all (written aside, then hard-linked into
    place, which refuses an existing name without following it).
    """
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # missing, or a link: the root's seed is not followed anywhere
    with os.fdopen(fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
            return
        data = src.read(MAX_SEED_BYTES)
    if os.path.lexists(target):
        return
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".seed")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        with contextlib.suppress(FileExistsError):
            os.link(temporary, target, follow_symlinks=False)
    finally:
        os.unlink(temporary)


def _within(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)
