"""A long-lived tool process (an MCP stdio server, say) through ``ToolSettings.sandbox_command``."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import psutil
import pytest

from agent.tools.registry import ToolSettings
from agent.tools.sandbox import Sandbox, probe_bwrap

pytestmark = pytest.mark.skipif(probe_bwrap() is not None, reason="bubblewrap unusable here")


async def test_a_stdio_server_talks_and_ends_with_everything_it_started(tmp_path: Path) -> None:
    marker = f"55.{uuid.uuid4().int % 10**6}"
    settings = ToolSettings(workspace=tmp_path, allowed_paths=(tmp_path,), sandbox=Sandbox.from_mode("bwrap"))
    server = f"setsid -f sleep {marker}; while read -r line; do echo \"got $line\"; done"
    cmd = settings.sandbox_command(["bash", "-c", server], {"PATH": os.environ["PATH"]})
    proc = await asyncio.create_subprocess_exec(
        *cmd.argv, env=cmd.env, cwd=cmd.cwd, start_new_session=True,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"ping\n")
        await proc.stdin.drain()
        assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"got ping\n"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        cmd.release()
    await asyncio.sleep(0.2)
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
