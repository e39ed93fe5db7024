"""The bash tool under bubblewrap: what a hostile command line can no longer reach.

Each test runs the attack for real and asserts on harm: a secret seen, a file
written outside, a process left behind, a hidden file read, the network reached.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import psutil
import pytest

from agent.tools.bash import BashTool
from agent.tools.registry import ToolContext, ToolOutput, ToolSettings
from agent.tools.sandbox import Sandbox, ToolLimits, probe_bwrap

pytestmark = pytest.mark.skipif(probe_bwrap() is not None, reason=f"bubblewrap unusable: {probe_bwrap()}")

SECRET = "sk-fake-daemon-secret-3c9f"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    (ws / ".botd").mkdir(parents=True)
    (ws / ".botd" / "valkey.pass").write_text(SECRET)
    return ws


def sandboxed(workspace: Path, *, timeout_s: float = 20, **limits: int) -> ToolContext:
    sandbox = Sandbox.from_mode("bwrap", limits=ToolLimits(**limits), hidden=[workspace / ".botd"])
    settings = ToolSettings(
        workspace=workspace, allowed_paths=(workspace,), timeout_s=timeout_s, max_output_bytes=8192, sandbox=sandbox
    )
    return ToolContext(run_id="r", session_key="s", settings=settings)


async def bash(ctx: ToolContext, command: str, **extra: float) -> ToolOutput:
    tool = BashTool(ctx.settings)
    return await tool.execute({"command": command, **extra}, ctx)


def processes_with(marker: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(marker in part for part in proc.info["cmdline"] or []):
            found.append(proc.pid)
    return found


async def test_the_daemon_environment_and_processes_are_invisible(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    ctx = sandboxed(workspace)
    out = await bash(ctx, "cat /proc/$PPID/environ; cat /proc/1/environ; grep -a -r . /proc/*/environ")
    assert SECRET not in out.content
    listing = await bash(ctx, "ps -eo args")
    assert "python" not in listing.content  # the daemon's process is not even listed


async def test_botd_files_are_masked(workspace: Path) -> None:
    out = await bash(sandboxed(workspace), "cat .botd/valkey.pass; ls -a .botd; cat $(find / -name valkey.pass 2>/dev/null)")
    assert SECRET not in out.content


async def test_only_the_workspace_and_private_tmp_are_writable(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    out = await bash(
        sandboxed(workspace),
        f"echo x > {outside}; echo y > inside.txt; echo z > /tmp/scratch && cat /tmp/scratch; echo w > .botd/planted",
    )
    assert not outside.exists()
    assert (workspace / "inside.txt").read_text() == "y\n"
    assert "z" in out.content
    assert not (workspace / ".botd" / "planted").exists()


async def test_no_process_survives_the_call(workspace: Path) -> None:
    marker = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    out = await bash(
        sandboxed(workspace),
        f"setsid -f sleep 9{marker}; nohup sleep 8{marker} >/dev/null 2>&1 & (sleep 7{marker} &) ; echo started",
    )
    assert "started" in out.content
    await asyncio.sleep(0.2)
    assert processes_with(marker) == []


async def test_a_timeout_ends_the_whole_sandbox(workspace: Path) -> None:
    marker = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    out = await bash(sandboxed(workspace), f"setsid -f sleep 9{marker}; sleep 6{marker}", timeout_s=1)
    assert out.is_error and "timed out" in out.content
    await asyncio.sleep(0.2)
    assert processes_with(marker) == []


async def test_cancelling_the_call_ends_the_whole_sandbox(workspace: Path) -> None:
    marker = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    task = asyncio.create_task(bash(sandboxed(workspace), f"setsid -f sleep 9{marker}; sleep 6{marker}"))
    for _ in range(100):
        await asyncio.sleep(0.05)
        if len(processes_with(marker)) >= 2:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.2)
    assert processes_with(marker) == []


async def test_the_daemon_cannot_be_killed(workspace: Path) -> None:
    parent = psutil.Process(os.getpid()).create_time()
    out = await bash(sandboxed(workspace), f"pkill -9 -f pytest; kill -9 {os.getpid()}; echo tried; kill -9 $PPID")
    assert "tried" in out.content or out.is_error  # killing its own sandbox is all it can do
    assert psutil.Process(os.getpid()).create_time() == parent


async def test_a_fork_bomb_ends_as_an_error_result(workspace: Path) -> None:
    # The blocklist refuses the classic spelling; a loop is the same attack in other words.
    command = "python3 -c 'import os, time\nfor _ in range(5000):\n    os.fork() or time.sleep(30)'"
    out = await bash(sandboxed(workspace, timeout_s=5, processes=64), command)
    assert out.is_error
    assert "Resource temporarily unavailable" in out.content or "BlockingIOError" in out.content


async def test_a_disk_fill_is_cut_at_the_file_size_limit(workspace: Path) -> None:
    out = await bash(sandboxed(workspace, file_size_mb=2), "head -c 50M /dev/zero > big; echo done")
    assert "File size limit exceeded" in out.content
    assert (workspace / "big").stat().st_size <= 2 * 1024 * 1024


async def test_there_is_no_network_by_default(workspace: Path) -> None:
    reached = asyncio.Event()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reached.set()
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        out = await bash(
            sandboxed(workspace),
            f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=2)'",
        )
    assert not reached.is_set()
    assert "Connection refused" in out.content


def test_bwrap_mode_refuses_to_start_without_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.tools import sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module, "probe_bwrap", lambda: "bubblewrap is not installed")
    with pytest.raises(sandbox_module.SandboxUnavailable):
        Sandbox.from_mode("bwrap")
    fallback = Sandbox.from_mode("auto")
    assert not fallback.active and "not installed" in fallback.describe()
