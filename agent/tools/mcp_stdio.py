"""The stdio link to an MCP server process: exact environment, a command wrapper, a bounded read.

The SDK's own stdio client merges a default environment (HOME, LOGNAME, PATH …)
into the child's; botd's rule is stricter — the child gets the allowlist plus
what the server declares, nothing else — so the process is started here and
the SDK's ``Client`` only gets the two message streams.

``CommandWrapper`` is the seam for the tool sandbox: it receives the server, the
argv, the environment and the working directory and returns the command to
actually execute (the daemon's wraps it in bubblewrap, see
``bot.mcp_servers.sandboxed``). The default runs the command as it is. The server
leads its own session, so closing the link ends the whole process group (with
bubblewrap, its PID namespace goes with it); the command's ``release()`` then
clears what the sandbox kept for it.

A line from the server is capped (``MAX_LINE_BYTES``): a server that writes an
endless line is cut off instead of growing botd's memory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import mcp.types as mcp_types
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from agent.tools.mcp_spec import CommandWrapper, McpServerSpec, run_directly

MAX_LINE_BYTES = 32 * 1024 * 1024
STDERR_TAIL_BYTES = 4096
# After stdin closes, how long the server may take to exit before its group is killed.
_EXIT_GRACE_S = 1.0
_KILL_WAIT_S = 2.0


@dataclass
class StdioLink:
    """What the supervisor can observe of a running server process."""

    pid: int
    closed: anyio.Event = field(default_factory=anyio.Event)
    stderr_tail: bytearray = field(default_factory=bytearray)
    problem: str | None = None

    def note_stderr(self, data: bytes) -> None:
        self.stderr_tail += data
        if len(self.stderr_tail) > STDERR_TAIL_BYTES:
            del self.stderr_tail[: len(self.stderr_tail) - STDERR_TAIL_BYTES]

    def last_stderr_line(self) -> str:
        """The server's last non-empty stderr line (often why it died), at most 300 characters."""
        lines = [line for line in bytes(self.stderr_tail).decode("utf-8", "replace").splitlines() if line.strip()]
        return lines[-1].strip()[:300] if lines else ""


@asynccontextmanager
async def stdio_link(
    server: McpServerSpec,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    wrapper: CommandWrapper = run_directly,
) -> AsyncIterator[
    tuple[StdioLink, MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
]:
    """Start the server and yield its link and the (read, write) streams the SDK session uses.

    Raises ``OSError`` when the program cannot be started. On exit (normal, error or
    cancellation) the process group is gone.
    """
    command = wrapper(server, argv, env, cwd)
    try:
        process = await anyio.open_process(
            command.argv,
            env=command.env,
            cwd=str(command.cwd),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except BaseException:
        command.release()
        raise
    link = StdioLink(pid=process.pid)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def read_stdout() -> None:
        assert process.stdout is not None
        buffer = b""
        try:
            async with read_writer:
                async for chunk in process.stdout:
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    if len(buffer) > MAX_LINE_BYTES:
                        link.problem = f"the server sent a message over {MAX_LINE_BYTES} bytes"
                        return
                    for line in lines:
                        if line.strip():
                            await read_writer.send(_parse(line))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        finally:
            link.closed.set()

    async def write_stdin() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode("utf-8"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            link.closed.set()

    async def read_stderr() -> None:
        assert process.stderr is not None
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for chunk in process.stderr:
                link.note_stderr(chunk)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read_stdout)
        tasks.start_soon(write_stdin)
        tasks.start_soon(read_stderr)
        try:
            yield link, read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
                await anyio.to_thread.run_sync(command.release)
                for stream in (read_stream, write_stream):
                    await stream.aclose()
            tasks.cancel_scope.cancel()


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:  # the session reports it; one bad line does not end the link
        return exc


async def _stop(process: Process) -> None:
    """Close stdin (the spec's polite request), then kill the whole group."""
    if process.stdin is not None:
        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    await _wait_exit(process, _EXIT_GRACE_S)
    # Even after the leader exited, children it left behind share the group: end them too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    await _wait_exit(process, _KILL_WAIT_S)
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await pipe.aclose()


async def _wait_exit(process: Process, within_s: float) -> None:
    """Poll for the leader's exit: ``wait()`` would also wait for pipes a grandchild may hold open."""
    deadline = anyio.current_time() + within_s
    while process.returncode is None and anyio.current_time() < deadline:
        await anyio.sleep(0.01)
