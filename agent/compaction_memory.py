"""The file tools of the memory flush, confined to the workspace memory files.

The flush runs unattended over a conversation that may contain anything, so it
gets the least it needs: ``read_file`` and ``write_file`` on MEMORY.md and
memory/*.md, nothing else. Two layers enforce it: the path guard's allowed roots
are exactly MEMORY.md and the memory directory (symlinks resolved, denied paths
kept), and a wrapper admits only MEMORY.md itself or a ``.md`` file directly in
memory/, which roots alone cannot express.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Final

from agent.tools.paths import PathDeniedError, PathGuard
from agent.tools.registry import Tool, ToolContext, ToolOutput, ToolRegistry, ToolSettings

MEMORY_FILE: Final[str] = "MEMORY.md"
MEMORY_DIR: Final[str] = "memory"
FLUSH_TOOL_NAMES: Final[tuple[str, ...]] = ("read_file", "write_file")
DENIED_TEXT: Final[str] = (
    "Error: during the memory flush only MEMORY.md and memory/*.md in the workspace may be read "
    "or written; {path!r} is not one of them."
)


def memory_tool_settings(base: ToolSettings, workspace: Path) -> ToolSettings:
    """``base`` with the allowed paths narrowed to the memory files of ``workspace``."""
    root = Path(os.path.abspath(os.path.expanduser(str(workspace))))
    return dataclasses.replace(
        base,
        workspace=root,
        allowed_paths=(root / MEMORY_FILE, root / MEMORY_DIR),
    )


def is_memory_path(path: Path, workspace: Path) -> bool:
    """True for ``<workspace>/MEMORY.md`` or a ``.md`` file directly in ``<workspace>/memory``.

    ``path`` must already be resolved (symlinks followed), as ``PathGuard.resolve`` returns it.
    """
    root = Path(os.path.realpath(os.path.expanduser(str(workspace))))
    if path == root / MEMORY_FILE:
        return True
    return path.parent == root / MEMORY_DIR and path.suffix == ".md" and path.stem != ""


class MemoryFileTool(Tool):
    """A file tool that refuses every path but the memory files, then delegates."""

    def __init__(self, inner: Tool) -> None:
        self.inner = inner
        self.name = inner.name
        self.category = inner.category
        self.parameters = inner.parameters
        self.description = f"{inner.description} In this run only MEMORY.md and memory/<name>.md in the workspace are allowed."

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raw = args.get("path")
        if not isinstance(raw, str):
            raise PathDeniedError("Error: a path is required.")
        resolved = PathGuard.from_settings(ctx.settings).resolve(raw)
        if not is_memory_path(resolved, ctx.settings.workspace):
            raise PathDeniedError(DENIED_TEXT.format(path=raw))
        return await self.inner.execute(args, ctx)


def memory_tools(tools: ToolRegistry) -> ToolRegistry:
    """``read_file`` and ``write_file`` from ``tools``, each wrapped by :class:`MemoryFileTool`.

    Raises ``ValueError`` when ``tools`` has no ``write_file``: a flush that cannot write is pointless.
    """
    found = [tool for name in FLUSH_TOOL_NAMES if (tool := tools.get(name)) is not None]
    if not any(tool.name == "write_file" for tool in found):
        raise ValueError("the memory flush needs the write_file tool, and the registry has none")
    return ToolRegistry(MemoryFileTool(tool) for tool in found)
