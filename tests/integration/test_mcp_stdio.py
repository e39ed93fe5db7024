"""MCP servers over stdio: the real SDK client against the fake MCPServer in a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.llm import LLMClient
from agent.loop import CANCELLED_TOOL_RESULT, RunCancelled, run_loop
from agent.tools.mcp import McpManager, probe_servers
from agent.tools.mcp_spec import McpServerSpec
from agent.tools.registry import ToolContext, ToolError, ToolRegistry, ToolSettings
from agent.types import Message, ToolPolicy
from tests.fakes.mcp_rig import ALLOWLIST, ready, stdio_spec, wait_for, wait_for_file
from tests.fakes.openai_server import Call, FakeOpenAI, Reply

SECRETS = {"OPENAI_API_KEY": "sk-daemon-secret-123", "TELEGRAM_BOT_TOKEN": "123:daemon-token"}


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    path = tmp_path / "markers"
    path.mkdir()
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


def context(workspace: Path, policy: ToolPolicy | None = None, max_output_bytes: int = 204_800) -> ToolContext:
    return ToolContext(
        run_id="run1", session_key="agent:main:test:dm:1",
        settings=ToolSettings(workspace=workspace, max_output_bytes=max_output_bytes),
        policy=policy or ToolPolicy(),
    )


async def start(specs: list[McpServerSpec], workspace: Path, backoff_s: tuple[float, ...] = (0.2,)) -> McpManager:
    manager = McpManager(specs, ToolRegistry(), cwd=workspace, env_allowlist=ALLOWLIST, backoff_s=backoff_s)
    await manager.start()
    return manager


@pytest.fixture
async def fake(markers: Path, workspace: Path) -> AsyncIterator[McpManager]:
    spec = stdio_spec(
        "fake", markers, tool_categories={"touch": "admin"}, disabled_tools=frozenset({"crash"}), timeout_s=5
    )
    manager = await start([spec], workspace)
    await wait_for(manager, "fake", ready)
    yield manager
    await manager.stop()


@pytest.fixture
async def llm() -> AsyncIterator[tuple[FakeOpenAI, LLMClient]]:
    async with FakeOpenAI() as server:
        client = LLMClient(
            model="gpt-test", base_url=server.base_url, api_key="sk-test-key-000000", request_timeout_s=10,
            max_retries=1, retry_base_s=0.01, retry_cap_s=0.02,
        )
        yield server, client
        await client.aclose()


async def call(manager: McpManager, name: str, args: dict[str, Any], workspace: Path, **kw: Any) -> Any:
    tool = manager.registry.get(name)
    assert tool is not None, f"{name} is not registered: {manager.registry.names()}"
    return await tool.execute(args, context(workspace, **kw))


async def test_tools_are_offered_as_server_tool_with_the_servers_schema_and_categories(fake: McpManager) -> None:
    registry = fake.registry
    names = set(registry.names())
    assert {"fake__echo", "fake__add", "fake__slow", "fake__touch", "fake__picture"} <= names
    assert "fake__crash" not in names  # disabled_tools
    echo = registry.get("fake__echo")
    assert echo is not None
    assert echo.description.startswith("[MCP server fake] ") and "Return the text unchanged." in echo.description
    assert echo.parameters["properties"]["text"]["type"] == "string" and echo.parameters["required"] == ["text"]
    assert echo.category == "write"  # the server's default category
    touch = registry.get("fake__touch")
    assert touch is not None and touch.category == "admin"  # per-tool override
    status = fake.snapshot()[0]
    assert (status.state, status.tools, status.last_error) == ("ready", len(names), None)


async def test_enabled_tools_limits_what_is_offered(markers: Path, workspace: Path) -> None:
    manager = await start([stdio_spec("few", markers, enabled_tools=frozenset({"echo", "add"}))], workspace)
    try:
        await wait_for(manager, "few", ready)
        assert sorted(manager.registry.names()) == ["few__add", "few__echo"]
    finally:
        await manager.stop()


async def test_calls_answer_and_invalid_arguments_are_refused_before_the_server(
    fake: McpManager, workspace: Path
) -> None:
    out = await call(fake, "fake__add", {"a": 2, "b": 40}, workspace)
    assert (out.content, out.is_error) == ("42", False)
    with pytest.raises(ToolError, match="invalid arguments"):
        fake.registry.parse_arguments("fake__add", json.dumps({"a": "two", "b": 1}))
    with pytest.raises(ToolError, match="invalid arguments"):
        fake.registry.parse_arguments("fake__echo", "{}")
    # A server-side failure is an error result, not an exception.
    out = await call(fake, "fake__fail", {}, workspace)
    assert out.is_error


async def test_images_become_files_and_large_results_are_capped(fake: McpManager, workspace: Path) -> None:
    out = await call(fake, "fake__picture", {}, workspace)
    assert out.content.startswith("a picture\n[image: ")
    path = Path(out.content.split("[image: ", 1)[1].split(" (", 1)[0])
    assert path.is_relative_to(workspace / "mcp" / "fake")
    assert (await asyncio.to_thread(path.read_bytes)).startswith(b"\x89PNG")
    out = await call(fake, "fake__big", {"size": 50_000}, workspace, max_output_bytes=4096)
    assert "[output truncated: " in out.content and len(out.content.encode()) < 4096 + 100


async def test_tool_list_refreshes_on_list_changed(fake: McpManager, workspace: Path) -> None:
    assert fake.registry.get("fake__added") is None
    out = await call(fake, "fake__grow", {}, workspace)
    assert out.content == "grown"
    await wait_for(fake, "fake", lambda s: fake.registry.get("fake__added") is not None)
    out = await call(fake, "fake__added", {}, workspace)
    assert out.content == "added answers"


async def test_a_call_over_timeout_s_is_cancelled_on_the_server(
    markers: Path, workspace: Path
) -> None:
    manager = await start([stdio_spec("fake", markers, timeout_s=0.5)], workspace)
    try:
        await wait_for(manager, "fake", ready)
        with pytest.raises(ToolError, match="timed out after 0.5 s"):
            await call(manager, "fake__slow", {"seconds": 30, "tag": "timeout"}, workspace)
        await wait_for_file(markers / "cancelled-timeout")
        out = await call(manager, "fake__echo", {"text": "still here"}, workspace)
        assert out.content == "still here"
    finally:
        await manager.stop()


async def test_stop_cancels_a_running_mcp_call(
    fake: McpManager, llm: tuple[FakeOpenAI, LLMClient], workspace: Path, markers: Path
) -> None:
    server, model = llm
    server.script(Reply.tool_calls([Call("fake__slow", {"seconds": 60, "tag": "stop"}, id="s")]), Reply.text("x"))
    task = asyncio.create_task(
        run_loop([Message.user("wait")], model=model, tools=fake.registry, ctx=context(workspace), run_id="r")
    )
    await wait_for_file(markers / "started-stop")
    task.cancel()  # what /stop does to the run's task
    with pytest.raises(RunCancelled) as stopped:
        await task
    result = stopped.value.result
    assert result.status == "cancelled"
    assert [m.content for m in result.messages if m.role == "tool"] == [CANCELLED_TOOL_RESULT]
    await wait_for_file(markers / "cancelled-stop")  # the server was told, through the SDK's cancellation
    out = await call(fake, "fake__echo", {"text": "after stop"}, workspace)
    assert out.content == "after stop"


async def test_admin_tools_ask_for_approval(
    fake: McpManager, llm: tuple[FakeOpenAI, LLMClient], workspace: Path, markers: Path
) -> None:
    server, model = llm
    asked: list[str] = []

    async def approve(name: str, args: dict[str, Any]) -> bool:
        asked.append(name)
        return args["name"] == "approved"

    server.script(
        Reply.tool_calls([Call("fake__touch", {"name": "denied"}, id="d")]),
        Reply.tool_calls([Call("fake__touch", {"name": "approved"}, id="a")]),
        Reply.text("done"),
    )
    result = await run_loop(
        [Message.user("touch")], model=model, tools=fake.registry, ctx=context(workspace), run_id="r",
        approve=approve,
    )
    results = {m.tool_call_id: m for m in result.messages if m.role == "tool"}
    assert asked == ["fake__touch", "fake__touch"]
    assert results["d"].is_error and "denied" in (results["d"].content or "")
    assert not (markers / "denied").exists()
    assert (results["a"].content, results["a"].is_error) == ("touched approved", False)
    assert (markers / "approved").exists()


@pytest.mark.parametrize(
    ("allow", "echo_runs", "touch_runs"),
    [((), False, False), (("write",), True, False), (("write", "admin"), True, True)],
)
async def test_scheduled_runs_follow_the_jobs_grants(
    fake: McpManager, llm: tuple[FakeOpenAI, LLMClient], workspace: Path, markers: Path,
    allow: tuple[Any, ...], echo_runs: bool, touch_runs: bool,
) -> None:
    server, model = llm
    server.script(
        Reply.tool_calls([Call("fake__echo", {"text": "hi"}, id="e"), Call("fake__touch", {"name": "cron"}, id="t")]),
        Reply.text("done"),
    )
    policy = ToolPolicy(context="scheduled", allow=allow)
    result = await run_loop(
        [Message.user("job")], model=model, tools=fake.registry, ctx=context(workspace, policy), run_id="r"
    )
    results = {m.tool_call_id: m for m in result.messages if m.role == "tool"}
    assert results["e"].is_error is not echo_runs
    assert results["t"].is_error is not touch_runs
    assert (markers / "cron").exists() is touch_runs
    if not echo_runs:
        assert "not allowed in a scheduled run" in (results["e"].content or "")


async def test_the_server_environment_holds_no_daemon_secret(
    markers: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    spec = stdio_spec("fake", markers)
    spec = replace(spec, env={**spec.env, "DECLARED": "yes"})
    manager = await start([spec], workspace)
    try:
        await wait_for(manager, "fake", ready)
        out = await call(manager, "fake__environment", {}, workspace)
    finally:
        await manager.stop()
    env = json.loads(out.content)
    assert env["DECLARED"] == "yes"
    for value in SECRETS.values():
        assert value not in out.content
    # Only the allowlist and the declared variables (Python itself may add LC_CTYPE).
    assert set(env) - {"LC_CTYPE"} <= {*ALLOWLIST, "FAKE_MCP_MARKERS", "DECLARED"}


async def test_a_crashing_server_is_restarted_and_its_tools_answer_errors_meanwhile(
    markers: Path, workspace: Path
) -> None:
    manager = await start([stdio_spec("fake", markers)], workspace, backoff_s=(1.5,))
    try:
        await wait_for(manager, "fake", ready)
        with pytest.raises(ToolError, match="MCP server 'fake'"):
            await call(manager, "fake__crash", {}, workspace)
        down = await wait_for(manager, "fake", lambda s: s.state == "restarting")
        assert down.restarts == 1 and down.last_error
        with pytest.raises(ToolError, match="not connected"):
            await call(manager, "fake__echo", {"text": "meanwhile"}, workspace)
        assert manager.registry.get("fake__echo") is not None  # still listed while down
        await wait_for(manager, "fake", ready)
        out = await call(manager, "fake__echo", {"text": "back"}, workspace)
        assert out.content == "back"
        assert len((markers / "starts").read_text().split()) == 2
    finally:
        await manager.stop()


async def test_servers_that_cannot_start_are_retried_and_do_not_affect_others(
    markers: Path, workspace: Path
) -> None:
    specs = [
        stdio_spec("missing", markers, command=str(workspace / "no-such-program"), args=()),
        stdio_spec("exits", markers, mode="fail"),
        stdio_spec("good", markers),
    ]
    manager = await start(specs, workspace)
    try:
        await wait_for(manager, "good", ready)
        missing = await wait_for(manager, "missing", lambda s: s.restarts >= 2)
        assert "could not start" in (missing.last_error or "") and "No such file" in (missing.last_error or "")
        exits = await wait_for(manager, "exits", lambda s: s.restarts >= 1)
        assert "the configuration is missing" in (exits.last_error or "")  # the server's own stderr
        assert missing.tools == 0 and missing.state == "restarting"
        out = await call(manager, "good__echo", {"text": "fine"}, workspace)
        assert out.content == "fine"
    finally:
        await manager.stop()
    assert {s.state for s in manager.snapshot()} == {"stopped"}


async def test_stop_ends_every_server_process(markers: Path, workspace: Path) -> None:
    manager = await start([stdio_spec("fake", markers)], workspace)
    await wait_for(manager, "fake", ready)
    pid = int((markers / "starts").read_text().split()[0])
    await manager.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_probe_reports_tool_counts_and_errors(markers: Path, workspace: Path) -> None:
    specs = [stdio_spec("good", markers, disabled_tools=frozenset({"crash"})), stdio_spec("bad", markers, mode="fail")]
    good, bad = await probe_servers(specs, cwd=workspace, env_allowlist=ALLOWLIST)
    assert good.last_error is None and good.tools >= 10
    assert bad.last_error is not None and "the configuration is missing" in bad.last_error


async def test_a_server_that_never_answers_is_restarted_after_startup_timeout_s(
    markers: Path, workspace: Path
) -> None:
    manager = await start([stdio_spec("mute", markers, mode="mute", startup_timeout_s=3)], workspace)
    try:
        await wait_for_file(markers / "starts", timeout_s=60)
        first_pid = int((markers / "starts").read_text().split()[0])
        seen = manager.snapshot()[0].restarts
        status = await wait_for(manager, "mute", lambda s: s.restarts > seen)
        assert "no answer within 3 s" in (status.last_error or "")
        with pytest.raises(ProcessLookupError):  # the attempt that timed out left no process behind
            os.kill(first_pid, 0)
    finally:
        await manager.stop()


async def test_a_line_that_is_not_json_rpc_does_not_break_the_connection(markers: Path, workspace: Path) -> None:
    manager = await start([stdio_spec("noisy", markers, mode="noisy")], workspace)
    try:
        await wait_for(manager, "noisy", ready)
        out = await call(manager, "noisy__echo", {"text": "fine"}, workspace)
        assert out.content == "fine"
    finally:
        await manager.stop()
