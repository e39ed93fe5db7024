"""One MCP server: connect, keep its tool list current, restart it with backoff when it fails.

A connection lives in its own supervisor task for the life of the daemon. Nothing
it does can stop the daemon: a server that cannot start, dies, hangs or answers
garbage is logged, shown in the status snapshot and tried again after a backoff,
and its tools answer an error result meanwhile. Tool lists are fetched after
each connect and again on ``notifications/tools/list_changed`` (on 2026-era
connections that notification only flows inside a ``subscriptions/listen``
stream, so one is opened when the server offers it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as mcp_types
import structlog
from mcp import Client, MCPError
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from agent.tools.environment import subprocess_env
from agent.tools.mcp_spec import CommandWrapper, McpServerSpec, McpServerStatus, State, run_directly
from agent.tools.mcp_stdio import StdioLink, stdio_link

log = structlog.get_logger(__name__)

BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
# A connection that stayed up this long starts the backoff over at its first step.
STABLE_S = 60.0
HEALTH_INTERVAL_S = 30.0
HEALTH_TIMEOUT_S = 10.0
MAX_LIST_PAGES = 100
CLIENT_INFO = mcp_types.Implementation(name="botd", version="0.1.0")


class McpUnavailable(Exception):
    """The server is not connected right now; the message is for the model."""


# Called with the server's current tool list after every (re)fetch.
ToolsListener = Callable[["McpConnection", list[mcp_types.Tool]], None]


class McpConnection:
    """The supervisor of one server (``run`` loops until cancelled) and its call path."""

    def __init__(
        self,
        spec: McpServerSpec,
        *,
        cwd: Path,
        env_allowlist: tuple[str, ...],
        on_tools: ToolsListener,
        wrapper: CommandWrapper = run_directly,
        environ: Mapping[str, str] | None = None,
        backoff_s: tuple[float, ...] = BACKOFF_S,
        health_interval_s: float = HEALTH_INTERVAL_S,
    ) -> None:
        self.spec = spec
        self._cwd = cwd
        self._env = subprocess_env(env_allowlist, spec.env, environ)
        self._on_tools = on_tools
        self._wrapper = wrapper
        self._backoff_s = backoff_s or BACKOFF_S
        self._health_interval_s = health_interval_s
        self.state: State = "starting"
        self.last_error: str | None = None
        self.restarts = 0
        self.tool_count = 0
        self.skipped_tools: tuple[str, ...] = ()
        self._client: Client | None = None
        self._link: StdioLink | None = None
        self._ended = anyio.Event()
        self._refresh_wanted = anyio.Event()
        self._check_now = anyio.Event()
        self._fingerprint = ""
        self.log = log.bind(mcp_server=spec.name)

    # -- status ---------------------------------------------------------------------
    def status(self) -> McpServerStatus:
        return McpServerStatus(
            name=self.spec.name, transport=self.spec.transport, state=self.state, tools=self.tool_count,
            last_error=self.last_error, restarts=self.restarts, skipped_tools=self.skipped_tools,
        )

    # -- supervision ----------------------------------------------------------------
    async def run(self) -> None:
        """Connect, serve until the connection ends, back off, repeat; only cancellation ends it."""
        failures = 0
        try:
            while True:
                started = time.monotonic()
                error = await self._serve_once()
                if time.monotonic() - started >= STABLE_S:
                    failures = 0
                delay = self._backoff_s[min(failures, len(self._backoff_s) - 1)]
                failures += 1
                self.restarts += 1
                self.state = "restarting"
                self.last_error = error
                self.log.warning("mcp.server_down", error=error, retry_in_s=delay)
                await asyncio.sleep(delay)
        finally:
            self.state = "stopped"
            self._client = None

    async def probe(self) -> list[mcp_types.Tool]:
        """Connect once, list the tools, disconnect (``botd doctor``); raises on any failure."""
        # asyncio's timeout, not anyio's: the cancel scopes opened inside must close inside it.
        async with asyncio.timeout(self.spec.startup_timeout_s), self._open() as client:
            return await self._list_tools(client)

    async def _serve_once(self) -> str:
        """One connection from spawn/connect to its end; returns why it ended (never raises)."""
        self._ended = anyio.Event()
        ready = anyio.Event()
        timed_out = False

        async def watchdog(scope: anyio.CancelScope) -> None:
            nonlocal timed_out
            with anyio.move_on_after(self.spec.startup_timeout_s):
                await ready.wait()
                return
            timed_out = True
            scope.cancel()

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(watchdog, tasks.cancel_scope)
                async with self._open() as client:
                    self._publish(await self._list_tools(client))
                    self._client, self.state, self.last_error = client, "ready", None
                    ready.set()
                    self.log.info("mcp.server_ready", tools=self.tool_count, protocol=client.protocol_version)
                    tasks.start_soon(self._refresher, client)
                    tasks.start_soon(self._listener, client)
                    tasks.start_soon(self._watch, client)
                    await self._ended.wait()
                    self._client = None
                    tasks.cancel_scope.cancel()
        except Exception as exc:
            self._client = None
            return self.describe(exc)
        finally:
            self._client = None
        if timed_out:
            return f"no answer within {self.spec.startup_timeout_s:g} s of starting" + self._stderr_hint()
        return "the server closed the connection" + self._stderr_hint()

    @asynccontextmanager
    async def _open(self) -> AsyncIterator[Client]:
        """Spawn or reach the server and complete the handshake."""
        spec = self.spec
        self._link = None
        async with AsyncExitStack() as stack:
            transport: Any
            if spec.transport == "stdio":
                assert spec.command is not None
                link, read, write = await stack.enter_async_context(
                    stdio_link(spec, [spec.command, *spec.args], self._env, self._cwd, self._wrapper)
                )
                self._link = link  # kept after the end: its stderr tail says why the server died
                transport = contextlib.nullcontext((read, write))
                ended = self._ended

                async def end_with_link() -> None:
                    await link.closed.wait()
                    ended.set()

                watcher = await stack.enter_async_context(anyio.create_task_group())
                watcher.start_soon(end_with_link)
                stack.callback(watcher.cancel_scope.cancel)
            elif spec.transport == "sse":
                assert spec.url is not None
                transport = sse_client(spec.url, headers=dict(spec.headers), timeout=spec.startup_timeout_s)
            else:
                assert spec.url is not None
                http = await stack.enter_async_context(create_mcp_http_client(headers=dict(spec.headers)))
                transport = streamable_http_client(spec.url, http_client=http)
            client = Client(
                transport, mode="auto", cache=None, message_handler=self._on_message, client_info=CLIENT_INFO
            )
            yield await stack.enter_async_context(client)

    # -- tools ----------------------------------------------------------------------
    async def _list_tools(self, client: Client) -> list[mcp_types.Tool]:
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    def _publish(self, tools: list[mcp_types.Tool]) -> None:
        self._fingerprint = _fingerprint(tools)
        self._on_tools(self, tools)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mcp_types.ServerNotification):
            message = message.root if hasattr(message, "root") else message
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._refresh_wanted.set()
        elif isinstance(message, Exception):
            self.log.warning("mcp.bad_message", error=self.describe(message))

    async def _refresher(self, client: Client) -> None:
        while True:
            await self._refresh_wanted.wait()
            self._refresh_wanted = anyio.Event()
            try:
                with anyio.fail_after(self.spec.timeout_s):
                    self._publish(await self._list_tools(client))
                self.log.info("mcp.tools_refreshed", tools=self.tool_count)
            except Exception as exc:
                self.log.warning("mcp.tools_refresh_failed", error=self.describe(exc))

    async def _listener(self, client: Client) -> None:
        """On 2026-era connections, ask for tools list-changed events (the handler sees them)."""
        capabilities = client.server_capabilities.tools
        if capabilities is None or not capabilities.list_changed:
            return
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    self._refresh_wanted.set()
        except Exception as exc:  # older protocol, or the stream dropped: refreshes still follow reconnects
            self.log.debug("mcp.listen_unavailable", error=self.describe(exc))

    async def _watch(self, client: Client) -> None:
        """Every ``health_interval_s`` (or at once after a failed call) list the tools: a server that
        does not answer is restarted, and a list that changed without a notification is taken.
        (``ping`` is gone from the 2026-era protocol; listing works on every version.)"""
        while True:
            with anyio.move_on_after(self._health_interval_s):
                await self._check_now.wait()
            self._check_now = anyio.Event()
            try:
                with anyio.fail_after(HEALTH_TIMEOUT_S):
                    tools = await self._list_tools(client)
            except Exception as exc:
                self.log.warning("mcp.health_check_failed", error=self.describe(exc))
                self._ended.set()
                return
            if _fingerprint(tools) != self._fingerprint:
                self._publish(tools)

    # -- calls ----------------------------------------------------------------------
    async def call(self, tool: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        """Call ``tool``; raises ``McpUnavailable`` or ``TimeoutError``, ``MCPError`` from the server."""
        client = self._client
        if client is None or self.state != "ready":
            raise McpUnavailable(self.unavailable_text())
        try:
            async with asyncio.timeout(self.spec.timeout_s):
                return await client.call_tool(tool, arguments)
        except MCPError as exc:
            if exc.code == mcp_types.CONNECTION_CLOSED:
                self._check_now.set()
                raise McpUnavailable(
                    f"Error: MCP server {self.spec.name!r} closed the connection during the call; "
                    "it is being restarted."
                ) from None
            raise
        except (TimeoutError, asyncio.CancelledError):
            raise
        except Exception as exc:
            # Maybe the connection is gone: check now rather than at the next health check.
            self._check_now.set()
            raise McpUnavailable(f"Error: MCP server {self.spec.name!r} failed the call: {self.describe(exc)}") from None

    def unavailable_text(self) -> str:
        why = f" (last error: {self.last_error})" if self.last_error else ""
        state = "is starting" if self.state == "starting" else "is not connected and is being restarted"
        return f"Error: MCP server {self.spec.name!r} {state}{why}; try again later."

    # -- helpers --------------------------------------------------------------------
    def _stderr_hint(self) -> str:
        link = self._link
        if link is None:
            return ""
        if link.problem:
            return f" ({link.problem})"
        line = link.last_stderr_line()
        return f"; stderr: {line}" if line else ""

    def describe(self, exc: BaseException) -> str:
        """A one-line reason for ``exc`` (never a traceback), with the server's last stderr line."""
        leaf = _leaf(exc)
        if isinstance(leaf, MCPError) and leaf.code == mcp_types.CONNECTION_CLOSED:
            text = "the server closed the connection"
        elif isinstance(leaf, OSError) and leaf.strerror:
            text = f"could not start {self.spec.command}: {leaf.strerror}" if self.spec.transport == "stdio" else leaf.strerror
        else:
            text = str(leaf).strip().splitlines()[0] if str(leaf).strip() else ""
            text = f"{type(leaf).__name__}: {text}" if text else type(leaf).__name__
        return text[:300] + self._stderr_hint()


def _fingerprint(tools: list[mcp_types.Tool]) -> str:
    return json.dumps([tool.model_dump(mode="json", exclude_none=True) for tool in tools], sort_keys=True)


def _leaf(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup):
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = inner[0] if inner else exc.exceptions[0]
    return exc
