"""Secrets botd generates for itself and keeps in files only botd's user can read.

The embedded store's password and the daemon key (which MACs approvals and cron
grants) live in ``<workspace>/.botd/`` (0700), each file 0600. That directory is
masked in the tool sandbox and always denied to the file tools, so a tool process
never reads them; the CLI and every daemon on the same workspace share them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make it 0700, also when it already existed."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def read_or_create_secret(path: Path, nbytes: int = 32) -> str:
    """The secret in ``path``; generated (0600, created exclusively) when the file is missing.

    Two processes racing to create it agree: the loser of ``O_EXCL`` reads the winner's.
    """
    private_dir(path.parent)
    token = secrets.token_urlsafe(nbytes)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read(path)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(token + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    return token


def _read(path: Path) -> str:
    for _ in range(50):  # the creator may not have written it yet
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, encoding="ascii") as handle:
            os.fchmod(handle.fileno(), 0o600)
            value = handle.read().strip()
        if value:
            return value
        time.sleep(0.02)
    raise OSError(f"{path} is empty; remove it and botd will generate a new one")
