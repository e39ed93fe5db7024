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

import dataclasses
import os
import re
import shutil
from collections import OrderedDict
from pathlib import Path
from typing import Literal

from agent.tools.registry import ToolSettings
from agent.types import RunRequest

USERS_DIR = "users"
CHATS_DIR = "chats"
# Copied from the workspace root into a new session directory when present there.
SEED_FILES = ("USER.md",)
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_CACHE_SIZE = 1024


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
    as_user = root / USERS_DIR / directory_name(req.channel, req.chat_id)
    return as_user if as_user.is_dir() else root / CHATS_DIR / directory_name(req.channel, req.chat_id)


class SessionWorkspaces:
    """The tool settings of each session's directory, built once per directory."""

    def __init__(self, base: ToolSettings, scope: Literal["user", "shared"]) -> None:
        self.base = base
        self.scope = scope
        self.root = Path(os.path.realpath(base.workspace))
        self._cache: OrderedDict[Path, ToolSettings] = OrderedDict()

    def settings_for(self, req: RunRequest) -> ToolSettings:
        if self.scope == "shared":
            return self.base
        directory = session_directory(self.root, req)
        cached = self._cache.get(directory)
        if cached is not None:
            self._cache.move_to_end(directory)
            return cached
        self._prepare(directory)
        outside = tuple(p for p in self.base.allowed_paths if not _within(Path(os.path.realpath(p)), self.root))
        settings = dataclasses.replace(
            self.base,
            workspace=directory,
            allowed_paths=(directory, *outside),
            readonly_paths=(self.root,),
            masked_paths=(*self.base.masked_paths, self.root / USERS_DIR, self.root / CHATS_DIR),
        )
        self._cache[directory] = settings
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return settings

    def _prepare(self, directory: Path) -> None:
        """Create and seed the directory (idempotent: an existing file is never overwritten)."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name in SEED_FILES:
            source, target = self.root / name, directory / name
            if source.is_file() and not source.is_symlink() and not target.exists():
                shutil.copyfile(source, target)


def _within(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)
