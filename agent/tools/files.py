"""The file tools: ``read_file``, ``write_file`` and ``list_directory``.

Every path goes through ``PathGuard`` first (symlinks resolved, denied beats
allowed), then is opened by ``safe_open`` exactly as checked (component by
component from directory fds, no link followed, hard-linked files refused), so a
link swapped in after the check cannot redirect the call. Reads are bounded by
``max_read_bytes`` and can be paged by line (``offset``/``limit``); binary files
and invalid UTF-8 are refused rather than mangled. Writes are atomic: a temporary
file in the checked directory, flushed to disk, then renamed within it, so a
reader never sees half a file. The blocking work runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import re
from pathlib import Path
from typing import Any

from agent.tools.paths import PathGuard
from agent.tools.registry import Tool, ToolContext, ToolError, ToolOutput
from agent.tools.safe_open import open_directory, open_file_for_reading, replace_file

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
        fd = open_file_for_reading(path, shown)
        with os.fdopen(fd, "rb") as handle:
            return _read_lines(handle, shown, offset, limit, budget, os.fstat(fd).st_size)
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
        written = await asyncio.to_thread(_write_atomically, path, args["path"], data)
        return ToolOutput(f"Wrote {len(data)} bytes to {written}.")


def _write_atomically(path: Path, shown: str, data: bytes) -> Path:
    try:
        replace_file(path, shown, data)
    except FileExistsError:
        raise ToolError(
            f"Error: cannot create {shown!r}: a parent path exists and is not a directory."
        ) from None
    except OSError as exc:
        raise _os_error(exc, shown, "writing") from None
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
        with open_directory(path, shown) as fd:
            items = sorted(((e.name, _describe(e, fd)) for e in os.scandir(fd)), key=lambda item: item[0])
    except NotADirectoryError:
        raise ToolError(f"Error: {shown!r} is a file, not a directory; use read_file.") from None
    except FileNotFoundError:
        raise ToolError(f"Error: {shown!r} does not exist.") from None
    except OSError as exc:
        raise _os_error(exc, shown, "listing") from None
    lines: list[str] = []
    used = 0
    for _, line in items[:_MAX_LIST_ENTRIES]:
        used += len(line.encode("utf-8")) + 1
        if used > budget:
            break
        lines.append(line)
    if not items:
        return f"({shown} is empty)"
    if len(lines) < len(items):
        lines.append(f"[{len(items) - len(lines)} more entries not shown; {len(items)} in total]")
    return "\n".join(lines)


def _describe(entry: os.DirEntry[str], dir_fd: int) -> str:
    try:
        if entry.is_symlink():
            return f"{entry.name} -> {os.readlink(entry.name, dir_fd=dir_fd)}"
        if entry.is_dir():
            return f"{entry.name}/"
        return f"{entry.name}  ({entry.stat().st_size} bytes)"
    except OSError:
        return f"{entry.name}  (unreadable)"
