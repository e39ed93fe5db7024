"""MCP servers as tool sources: start them all, keep their tools in the registry, report status.

``McpManager.start`` only launches one supervisor task per server and returns:
a slow server never delays the channels. Each server's tools are registered
as ``<server>__<tool>`` when its list arrives and replaced when it changes; a
server that goes down keeps its tools registered, and they answer an error
result until it is back. A tool whose schema the registry refuses, or whose
name collides, is skipped and named in the server's status.

Every replica runs its own connections; nothing here touches the store. The MCP SDK
is imported only when there is a server to talk to: the CLI and daemons without
servers skip its second or so of import time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from agent.tools.mcp_spec import CommandWrapper, McpServerSpec, McpServerStatus, run_directly
from agent.tools.registry import ToolRegistry

if TYPE_CHECKING:
    import mcp.types as mcp_types

    from agent.tools.mcp_connection import McpConnection

log = structlog.get_logger(__name__)

_STOP_WAIT_S = 10.0


class McpManager:
    """Owns every configured server's connection and its tools in ``registry``."""

    def __init__(
        self,
        specs: Iterable[McpServerSpec],
        registry: ToolRegistry,
        *,
        cwd: Path,
        env_allowlist: tuple[str, ...],
        wrapper: CommandWrapper = run_directly,
        environ: Mapping[str, str] | None = None,
        backoff_s: tuple[float, ...] | None = None,
    ) -> None:
        self.registry = registry
        self._cwd = cwd
        specs = list(specs)
        if specs:
            from agent.tools.mcp_connection import BACKOFF_S, McpConnection
        self.connections: dict[str, McpConnection] = {
            spec.name: McpConnection(
                spec, cwd=cwd, env_allowlist=env_allowlist, on_tools=self._sync, wrapper=wrapper,
                environ=environ, backoff_s=backoff_s or BACKOFF_S,
            )
            for spec in specs
        }
        self._registered: dict[str, list[str]] = {name: [] for name in self.connections}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Launch every server's supervisor; returns at once (servers connect in the background)."""
        if self._tasks:
            return
        await asyncio.to_thread(self._cwd.mkdir, parents=True, exist_ok=True)
        for name, connection in self.connections.items():
            self._tasks.append(asyncio.create_task(connection.run(), name=f"mcp:{name}"))

    async def stop(self) -> None:
        """Disconnect every server (their processes end); their tools stay registered, unusable."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=_STOP_WAIT_S)
            if pending:
                log.warning("mcp.slow_to_stop", servers=[t.get_name() for t in pending])
            for task in tasks:
                if task.done() and not task.cancelled():
                    with contextlib.suppress(Exception):
                        task.result()

    def snapshot(self) -> list[McpServerStatus]:
        """Each server's state, tool count and last error, for ``botd status`` and health checks."""
        return [connection.status() for connection in self.connections.values()]

    def _sync(self, connection: McpConnection, remote_tools: list[mcp_types.Tool]) -> None:
        """Replace the registry's tools of ``connection`` with the ones it offers now."""
        from agent.tools.mcp_tool import McpTool

        spec = connection.spec
        for name in self._registered[spec.name]:
            self.registry.unregister(name)
        registered: list[str] = []
        skipped: list[str] = []
        for remote in remote_tools:
            if not spec.offers(remote.name):
                continue
            tool = McpTool(connection, remote)
            try:
                self.registry.register(tool)
            except ValueError as exc:
                skipped.append(f"{remote.name}: {exc}"[:300])
                continue
            registered.append(tool.name)
        self._registered[spec.name] = registered
        connection.tool_count = len(registered)
        connection.skipped_tools = tuple(skipped)
        if skipped:
            log.warning("mcp.tools_skipped", mcp_server=spec.name, skipped=skipped)


async def probe_servers(
    specs: Iterable[McpServerSpec], *, cwd: Path, env_allowlist: tuple[str, ...],
    wrapper: CommandWrapper = run_directly,
) -> list[McpServerStatus]:
    """Connect to each server once, concurrently, and report its tools or why it failed (doctor)."""
    from agent.tools.mcp_connection import McpConnection

    async def one(spec: McpServerSpec) -> McpServerStatus:
        tools: list[mcp_types.Tool] = []
        connection = McpConnection(
            spec, cwd=cwd, env_allowlist=env_allowlist, on_tools=lambda _c, t: None, wrapper=wrapper
        )
        try:
            tools = await connection.probe()
        except Exception as exc:
            return McpServerStatus(spec.name, spec.transport, "stopped", 0, connection.describe(exc), 0)
        offered = sum(1 for tool in tools if spec.offers(tool.name))
        return McpServerStatus(spec.name, spec.transport, "ready", offered, None, 0)

    await asyncio.to_thread(cwd.mkdir, parents=True, exist_ok=True)
    return list(await asyncio.gather(*(one(spec) for spec in specs)))
