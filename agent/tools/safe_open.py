"""Open exactly the path that was checked: component by component, never following a link.

``PathGuard`` judges a symlink-free absolute path. Between that check and the
open, a tool process could swap a directory on the path for a symlink; opening
by name would then follow it elsewhere. Here every component is opened relative
to its parent's directory fd with ``O_NOFOLLOW``, starting at ``/``, so a swapped
link makes the open fail instead of escaping. Files are created and renamed
inside the checked directory fd. A regular file with more than one hard link is
refused for reading: its other names may sit where the guard would refuse them
(a hard link into ``.botd`` read back through the workspace).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from agent.tools.registry import ToolError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LinkSwapped(ToolError):
    """A component of a checked path turned into a symlink (or vanished) before it was opened."""


def _open_component(parent_fd: int, name: str, shown: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(parent_fd, name):
            raise LinkSwapped(f"Error: {shown!r} changed while it was being opened (a symlink appeared); not followed.") from None
        raise


def _is_link(parent_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def open_directory(path: Path, shown: str, *, create: bool = False) -> Iterator[int]:
    """A directory fd for the absolute, symlink-free ``path``; missing parts made when ``create``."""
    fd = os.open("/", _DIR_FLAGS)
    try:
        for name in path.parts[1:]:
            try:
                child = _open_component(fd, name, shown)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
                child = _open_component(fd, name, shown)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def open_file_for_reading(path: Path, shown: str) -> int:
    """An fd for the regular file at ``path`` (no link followed, single hard link); caller closes it."""
    with open_directory(path.parent, shown) as parent:
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise LinkSwapped(f"Error: {shown!r} became a symlink while it was being opened; not followed.") from None
            raise
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):
        os.close(fd)
        raise ToolError(f"Error: {shown!r} is a directory; use list_directory to see what it holds.")
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ToolError(f"Error: {shown!r} is not a regular file.")
    if info.st_nlink > 1:
        os.close(fd)
        raise ToolError(
            f"Error: {shown!r} has {info.st_nlink} hard links; its other names may be outside the allowed "
            "paths, so it is not read."
        )
    return fd


def replace_file(path: Path, shown: str, data: bytes) -> None:
    """Write ``data`` to a temporary file in ``path``'s directory, fsync, then rename it over ``path``.

    The directory is the checked one (held by fd); a symlink at ``path`` is replaced, never followed.
    """
    with open_directory(path.parent, shown, create=True) as parent:
        mode = _existing_mode(parent, path.name, shown)
        tmp = f".{path.name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fchmod(handle.fileno(), mode)
                os.fsync(handle.fileno())
            os.replace(tmp, path.name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
            raise


def _existing_mode(parent: int, name: str, shown: str) -> int:
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
    if stat.S_ISDIR(info.st_mode):
        raise ToolError(f"Error: {shown!r} is a directory; give a file path.")
    if stat.S_ISLNK(info.st_mode):
        raise LinkSwapped(f"Error: {shown!r} became a symlink after it was checked; not written.")
    return stat.S_IMODE(info.st_mode)
