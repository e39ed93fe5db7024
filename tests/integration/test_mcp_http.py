"""MCP servers over streamable HTTP and SSE on 127.0.0.1: the SDK client against the fake MCPServer."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.tools.mcp import McpManager
from agent.tools.mcp_spec import McpServerSpec, Transport
from agent.tools.registry import ToolContext, ToolError, ToolRegistry, ToolSettings
from tests.fakes.mcp_rig import ALLOWLIST, free_port, http_server, ready, wait_for


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    path = tmp_path / "markers"
    path.mkdir()
    return path


def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(run_id="r", session_key="s", settings=ToolSettings(workspace=tmp_path))


@pytest.mark.parametrize("transport", ["streamable_http", "sse"])
async def test_tools_are_listed_and_called_with_the_configured_headers(
    tmp_path: Path, markers: Path, transport: Transport
) -> None:
    async with http_server(markers, transport) as url:
        spec = McpServerSpec(
            name="web", transport=transport, url=url, headers={"Authorization": "Bearer t0ken"}, category="read",
        )
        manager = McpManager([spec], ToolRegistry(), cwd=tmp_path, env_allowlist=ALLOWLIST, backoff_s=(0.2,))
        await manager.start()
        try:
            status = await wait_for(manager, "web", ready)
            assert status.tools >= 10 and status.transport == transport
            echo = manager.registry.get("web__echo")
            assert echo is not None and echo.category == "read"
            out = await echo.execute({"text": "over http"}, ctx(tmp_path))
            assert (out.content, out.is_error) == ("over http", False)
            auth = manager.registry.get("web__authorization")
            assert auth is not None
            assert (await auth.execute({}, ctx(tmp_path))).content == "Bearer t0ken"
        finally:
            await manager.stop()


async def test_a_server_that_goes_away_is_reconnected(tmp_path: Path, markers: Path) -> None:
    async with http_server(markers) as url:
        spec = McpServerSpec(name="web", transport="streamable_http", url=url, timeout_s=5, startup_timeout_s=5)
        manager = McpManager([spec], ToolRegistry(), cwd=tmp_path, env_allowlist=ALLOWLIST, backoff_s=(0.3,))
        await manager.start()
        await wait_for(manager, "web", ready)
    try:
        echo = manager.registry.get("web__echo")
        assert echo is not None
        with pytest.raises(ToolError, match="MCP server 'web'"):
            await echo.execute({"text": "anyone?"}, ctx(tmp_path))
        down = await wait_for(manager, "web", lambda s: s.state == "restarting")
        assert down.last_error
        with pytest.raises(ToolError, match="not connected"):
            await echo.execute({"text": "anyone?"}, ctx(tmp_path))
    finally:
        await manager.stop()


async def test_a_url_nobody_answers_is_retried(tmp_path: Path) -> None:
    spec = McpServerSpec(
        name="nobody", transport="streamable_http", url=f"http://127.0.0.1:{free_port()}/mcp", startup_timeout_s=5
    )
    manager = McpManager([spec], ToolRegistry(), cwd=tmp_path, env_allowlist=ALLOWLIST, backoff_s=(0.2,))
    await manager.start()
    try:
        status = await wait_for(manager, "nobody", lambda s: s.restarts >= 2)
        assert status.state == "restarting" and status.tools == 0 and status.last_error
    finally:
        await manager.stop()
