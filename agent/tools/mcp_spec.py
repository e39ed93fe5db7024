"""What botd knows of an MCP server without talking to it: its spec, its status, how it is spawned.

Kept apart from the client (which imports the MCP SDK, about a second of start-up)
so the CLI and a daemon without MCP servers never load the SDK.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agent.tools.sandbox import SandboxCommand
from agent.types import Category

Transport = Literal["stdio", "streamable_http", "sse"]
State = Literal["starting", "ready", "restarting", "stopped"]

# (server, argv, env, cwd) -> what to exec: how a stdio server's command is actually run.
# The daemon confines it in the tool sandbox (``ToolSettings.sandbox``); ``release()`` runs
# after the server's process group is gone.
CommandWrapper = Callable[["McpServerSpec", Sequence[str], Mapping[str, str], Path], SandboxCommand]


def run_directly(
    server: McpServerSpec, argv: Sequence[str], env: Mapping[str, str], cwd: Path
) -> SandboxCommand:
    """The command as declared, unconfined (tests and tools that bring their own isolation)."""
    return SandboxCommand(argv=list(argv), env=dict(env), cwd=cwd)


@dataclass(frozen=True)
class McpServerSpec:
    """A configured server, with ``${VAR}`` references already resolved."""

    name: str
    transport: Transport
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    category: Category = "write"
    tool_categories: Mapping[str, Category] = field(default_factory=dict)
    enabled_tools: frozenset[str] | None = None
    disabled_tools: frozenset[str] = frozenset()
    timeout_s: float = 60.0
    startup_timeout_s: float = 30.0
    network: bool = True  # a stdio server inside the sandbox may reach the network

    def offers(self, tool: str) -> bool:
        """Whether the server's tool ``tool`` is offered to the model."""
        if tool in self.disabled_tools:
            return False
        return self.enabled_tools is None or tool in self.enabled_tools

    def category_of(self, tool: str) -> Category:
        return self.tool_categories.get(tool, self.category)


@dataclass(frozen=True)
class McpServerStatus:
    """One server as ``botd status`` and ``botd doctor`` show it."""

    name: str
    transport: Transport
    state: State
    tools: int
    last_error: str | None
    restarts: int
    skipped_tools: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "transport": self.transport, "state": self.state, "tools": self.tools,
            "last_error": self.last_error, "restarts": self.restarts, "skipped_tools": list(self.skipped_tools),
        }
