"""The tools every agent gets, plus the ones declared in the CLI tools file."""

from __future__ import annotations

from pathlib import Path

from agent.tools.bash import BashTool
from agent.tools.cli_tools import load_cli_tools
from agent.tools.files import ListDirectoryTool, ReadFileTool, WriteFileTool
from agent.tools.registry import Tool, ToolSettings
from agent.tools.send_file import SendFileTool

BUILTIN_TOOL_NAMES = ("bash", "read_file", "write_file", "list_directory", "send_file")


def builtin_tools(settings: ToolSettings) -> list[Tool]:
    """``bash``, ``read_file``, ``write_file``, ``list_directory`` and ``send_file``, shaped by ``settings``."""
    return [BashTool(settings), ReadFileTool(), WriteFileTool(), ListDirectoryTool(), SendFileTool()]


def load_tools(settings: ToolSettings, cli_tools_file: Path | None) -> list[Tool]:
    """The built-in tools followed by the CLI tools; raises ``ToolConfigError`` for a bad file."""
    tools = builtin_tools(settings)
    if cli_tools_file is not None:
        tools.extend(load_cli_tools(cli_tools_file, reserved=[t.name for t in tools]))
    return tools
