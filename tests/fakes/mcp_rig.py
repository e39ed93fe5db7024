"""Helpers around the fake MCP server: specs for it, an HTTP instance on 127.0.0.1, waiting for states."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.tools.mcp import McpManager
from agent.tools.mcp_spec import McpServerSpec, McpServerStatus, Transport

FAKE_SERVER = Path(__file__).with_name("mcp_server.py")
ALLOWLIST = ("PATH", "HOME", "LANG")


def stdio_spec(name: str, markers: Path, mode: str = "stdio", **fields: Any) -> McpServerSpec:
    spec = McpServerSpec(
        name=name, transport="stdio", command=sys.executable, args=(str(FAKE_SERVER), mode),
        env={"FAKE_MCP_MARKERS": str(markers)}, timeout_s=10, startup_timeout_s=20,
    )
    return replace(spec, **fields)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def http_server(markers: Path, transport: Transport = "streamable_http") -> AsyncIterator[str]:
    """The fake server over HTTP on 127.0.0.1; yields its endpoint URL."""
    port = free_port()
    mode = "sse" if transport == "sse" else "http"
    env = {**{k: os.environ[k] for k in ALLOWLIST if k in os.environ}, "FAKE_MCP_MARKERS": str(markers)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(FAKE_SERVER), mode, str(port), env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            break
        else:
            raise RuntimeError("the fake MCP server did not listen")
        yield f"http://127.0.0.1:{port}/" + ("sse" if transport == "sse" else "mcp")
    finally:
        process.kill()
        await process.wait()


async def wait_for(
    manager: McpManager, name: str, check: Callable[[McpServerStatus], bool], timeout_s: float = 30
) -> McpServerStatus:
    """Poll the manager's snapshot until ``check`` holds for server ``name``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        status = next(s for s in manager.snapshot() if s.name == name)
        if check(status):
            return status
        if loop.time() > deadline:
            raise AssertionError(f"server {name} never reached the expected state: {status}")
        await asyncio.sleep(0.05)


async def wait_for_file(path: Path, timeout_s: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await asyncio.to_thread(path.exists):
        if loop.time() > deadline:
            raise AssertionError(f"{path} never appeared")
        await asyncio.sleep(0.05)


def ready(status: McpServerStatus) -> bool:
    return status.state == "ready"
