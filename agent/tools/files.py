"""The file tools: ``read_file``, ``write_file`` and ``list_directory``.

Every path goes through ``PathGuard`` first (symlinks resolved, denied beats
allowed). Reads are bounded by ``max_read_bytes`` and can be paged by line
(``offset``/``limit``); binary files and invalid UTF-8 are refused rather than
mangled. Writes are atomic: a temporary file in the same directory, flushed to
disk, then ``os.replace``, so a reader never sees half a file. The blocking work
runs in a worker thread to keep the event loop free.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

from agent.tools.paths import PathGuard
from agent.tools.registry import Tool, ToolContext, ToolError, ToolOutput

_CHUNK = 65_536
_LINE = re.compile(r"[^\n]*\n|[^\n]+")
_MAX_LIST_ENTRIES = 1_000
_PATH_SCHEMA = {"type": "string", "minLength": 1, "maxLength": 4096}


def _os_error(exc: OSError, path: str, action: str) -> ToolError:
    """A clear message for the usual ways a filesystem call fails."""
    if isinstance(exc, FileNotFoundError):
        return ToolError(f"Error: {path!r} does not exist.")
    if isinstance(exc, PermissionError):
        return ToolError(f"Error: permission denied {action} {path!r}.")
    if isinstance(exc, IsADirectoryError):
        return ToolError(f"Error: {path!r} is a directory.")
    if isinstance(exc, NotADirectoryError):
        return ToolError(f"Error: a component of {path!r} is not a directory.")
    return ToolError(f"Error: cannot {action.removesuffix('ing')} {path!r}: {exc.strerror or exc}.")


class ReadFileTool(Tool):
    name = "read_file"
    category = "read"
    description = (
        "Read a UTF-8 text file. Paths are relative to the workspace. Large files are returned in "
        "pages: pass offset (first line, 1-based) and limit (number of lines) to read further."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {**_PATH_SCHEMA, "description": "File to read (relative to the workspace, or absolute)."},
            "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based)."},
            "limit": {"type": "integer", "minimum": 1, "description": "Maximum number of lines to return."},
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        path = PathGuard.from_settings(ctx.settings).resolve(args["path"])
        offset, limit = int(args.get("offset", 1)), args.get("limit")
        text = await asyncio.to_thread(
            _read_text,
            path,
            args["path"],
            offset,
            None if limit is None else int(limit),
            ctx.settings.max_read_bytes,
        )
        return ToolOutput(text)


def _read_text(path: Path, shown: str, offset: int, limit: int | None, budget: int) -> str:
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise ToolError(f"Error: {shown!r} is a directory; use list_directory to see what it holds.")
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"Error: {shown!r} is not a regular file.")
        with path.open("rb") as handle:
            return _read_lines(handle, shown, offset, limit, budget, info.st_size)
    except OSError as exc:
        raise _os_error(exc, shown, "reading") from None


def _read_lines(handle: Any, shown: str, offset: int, limit: int | None, budget: int, size: int) -> str:
    """Lines ``offset``… of the file, stopping at ``limit`` lines or ``budget`` bytes of output."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    out: list[str] = []
    used = 0
    line_no = 1  # number of the line being read
    taken = 0  # complete lines returned
    consumed = 0  # bytes read from the file
    at_line_start = True
    while True:
        chunk = handle.read(_CHUNK)
        if b"\x00" in chunk:
            raise ToolError(f"Error: {shown!r} looks like a binary file (it contains NUL bytes); not read.")
        pending = len(decoder.getstate()[0])  # bytes of an unfinished character from the last chunk
        try:
            text = decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as exc:
            where = consumed - pending + exc.start
            raise ToolError(
                f"Error: {shown!r} is not valid UTF-8 text (bad byte at offset {where}); not read."
            ) from None
        consumed += len(chunk)
        pieces = _LINE.findall(text)
        for index, piece in enumerate(pieces):
            complete = piece.endswith("\n")
            at_line_start = complete
            if line_no < offset:
                line_no += complete
                continue
            encoded = piece.encode("utf-8")
            if used + len(encoded) > budget:
                out.append(encoded[: budget - used].decode("utf-8", errors="ignore"))
                return _paged(out, f"line {line_no} was cut at the {budget}-byte limit", line_no + 1, size)
            out.append(piece)
            used += len(encoded)
            if complete:
                line_no += 1
                taken += 1
                if limit is not None and taken >= limit and _more(pieces, index, consumed, size, handle):
                    return _paged(out, f"showing lines {offset}-{line_no - 1}", line_no, size)
        if not chunk:
            break
    lines = line_no - 1 if at_line_start else line_no
    if offset > 1 and offset > lines:
        raise ToolError(f"Error: offset {offset} is past the end of {shown!r} ({lines} lines).")
    if size == 0 and not out:
        return f"({shown} is empty)"
    return "".join(out)


def _more(pieces: list[str], index: int, consumed: int, size: int, handle: Any) -> bool:
    return index + 1 < len(pieces) or consumed < size or bool(handle.read(1))


def _paged(out: list[str], what: str, next_offset: int, size: int) -> str:
    content = "".join(out).rstrip("\n")
    return f"{content}\n[{what} of a {size}-byte file; read on with offset={next_offset}]"


class WriteFileTool(Tool):
    name = "write_file"
    category = "write"
    description = (
        "Write a UTF-8 text file, replacing it if it exists (atomically) and creating missing parent "
        "directories. Paths are relative to the workspace."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {
                **_PATH_SCHEMA,
                "description": "File to write (relative to the workspace, or absolute).",
            },
            "content": {"type": "string", "description": "The complete new content of the file."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        guard = PathGuard.from_settings(ctx.settings)
        path = guard.resolve(args["path"])
        try:
            data = args["content"].encode("utf-8")
        except UnicodeEncodeError:
            raise ToolError(
                "Error: the content is not valid Unicode text (it holds a lone surrogate)."
            ) from None
        written = await asyncio.to_thread(_write_atomically, guard, path, args["path"], data)
        return ToolOutput(f"Wrote {len(data)} bytes to {written}.")


def _write_atomically(guard: PathGuard, path: Path, shown: str, data: bytes) -> Path:
    if path.is_dir():
        raise ToolError(f"Error: {shown!r} is a directory; give a file path.")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ToolError(
            f"Error: cannot create {shown!r}: a parent path exists and is not a directory."
        ) from None
    except OSError as exc:
        raise _os_error(exc, shown, "writing") from None
    path = guard.check_resolved(path)  # the directories now exist: judge the real location again
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    except OSError as exc:
        raise _os_error(exc, shown, "writing") from None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise _os_error(exc, shown, "writing") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _os_error(exc, shown, "writing") from None
        raise
    return path


class ListDirectoryTool(Tool):
    name = "list_directory"
    category = "read"
    description = (
        "List a directory: one entry per line, directories end with '/', symlinks show their target. "
        "Paths are relative to the workspace; the default is the workspace itself."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {**_PATH_SCHEMA, "description": "Directory to list (default: the workspace)."},
        },
        "additionalProperties": False,
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        shown = args.get("path", ".")
        path = PathGuard.from_settings(ctx.settings).resolve(shown)
        listing = await asyncio.to_thread(_list, path, shown, ctx.settings.max_output_bytes)
        return ToolOutput(listing)


def _list(path: Path, shown: str, budget: int) -> str:
    try:
        if not path.is_dir():
            if path.exists():
                raise ToolError(f"Error: {shown!r} is a file, not a directory; use read_file.")
            raise ToolError(f"Error: {shown!r} does not exist.")
        with os.scandir(path) as entries:
            items = sorted(entries, key=lambda e: e.name)
    except OSError as exc:
        raise _os_error(exc, shown, "listing") from None
    lines: list[str] = []
    used = 0
    for entry in items[:_MAX_LIST_ENTRIES]:
        line = _describe(entry)
        used += len(line.encode("utf-8")) + 1
        if used > budget:
            break
        lines.append(line)
    if not items:
        return f"({shown} is empty)"
    if len(lines) < len(items):
        lines.append(f"[{len(items) - len(lines)} more entries not shown; {len(items)} in total]")
    return "\n".join(lines)


def _describe(entry: os.DirEntry[str]) -> str:
    try:
        if entry.is_symlink():
            return f"{entry.name} -> {os.readlink(entry.path)}"
        if entry.is_dir():
            return f"{entry.name}/"
        return f"{entry.name}  ({entry.stat().st_size} bytes)"
    except OSError:
        return f"{entry.name}  (unreadable)"
