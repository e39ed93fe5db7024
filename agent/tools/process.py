"""Run one subprocess for a tool: its own process group, a timeout, a bounded output.

A tool call owns everything it starts. The child is the leader of a new session
(and so of a new process group); on timeout, on cancellation and after the leader
exits, the whole group is sent SIGKILL, so background children (``sleep 60 &``)
never outlive the call nor keep its pipes open. A child that calls ``setsid``
itself escapes the group: this is containment for well-behaved commands, not a
sandbox.

Output is captured with a fixed memory bound whatever the child writes: each
stream keeps its first and last bytes and counts the rest, and the rendered text
says how much was cut with ``[output truncated: N of M bytes]`` (N bytes cut out
of M written).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.tools.registry import ToolSettings

# After the leader exits, how long background children may keep writing before the group is killed.
_EXIT_GRACE_S = 0.5
# How long to wait for pipes to close after the group was killed.
_KILL_GRACE_S = 5.0


class CappedBuffer:
    """Keeps the first and last ``cap // 2`` bytes written to it and counts the total."""

    def __init__(self, cap: int) -> None:
        if cap < 2:
            raise ValueError("cap must be at least 2 bytes")
        self._head_cap = cap // 2
        self._tail_cap = cap - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def write(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            if len(self._tail) > self._tail_cap:
                del self._tail[: len(self._tail) - self._tail_cap]

    def render(self, limit: int) -> str:
        """The captured text, at most ``limit`` bytes of it, with a notice when bytes were cut."""
        limit = max(0, limit)
        kept = len(self._head) + len(self._tail)
        if self.total <= limit and kept == self.total:
            return (bytes(self._head) + bytes(self._tail)).decode("utf-8", errors="replace")
        head_n = min(len(self._head), limit // 2)
        tail_n = min(len(self._tail), limit - head_n)
        head = bytes(self._head[:head_n]).decode("utf-8", errors="replace")
        tail = (
            bytes(self._tail[len(self._tail) - tail_n :]).decode("utf-8", errors="replace") if tail_n else ""
        )
        cut = self.total - head_n - tail_n
        notice = f"[output truncated: {cut} of {self.total} bytes]"
        return f"{head}\n{notice}\n{tail}" if tail else f"{head}\n{notice}"


@dataclass
class ProcessResult:
    """What a finished (or killed) subprocess left behind."""

    argv: tuple[str, ...]
    exit_code: int | None
    stdout: CappedBuffer
    stderr: CappedBuffer
    timed_out: bool
    timeout_s: float
    max_output_bytes: int

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.exit_code == 0

    def render(self) -> str:
        """Stdout, then stderr, then the exit status, within ``max_output_bytes`` in total."""
        cap = self.max_output_bytes
        err_budget = min(self.stderr.total, max(cap // 4, cap - self.stdout.total))
        out_budget = cap - err_budget
        parts: list[str] = []
        if self.stdout.total:
            parts.append(self.stdout.render(out_budget).rstrip("\n"))
        if self.stderr.total:
            parts.append("[stderr]\n" + self.stderr.render(err_budget).rstrip("\n"))
        if self.timed_out:
            parts.append(f"[timed out after {self.timeout_s:g} s; the process group was killed]")
        elif self.exit_code is not None and self.exit_code < 0:
            parts.append(f"[killed by signal {-self.exit_code}]")
        else:
            parts.append(f"[exit code: {self.exit_code}]")
        return "\n".join(parts)


class _Collector(asyncio.SubprocessProtocol):
    """Feeds the child's output into capped buffers and reports exit and pipe closure separately.

    ``asyncio.subprocess.Process.wait()`` only returns once the pipes are closed,
    which a background grandchild can delay indefinitely; the leader's exit is
    what the timeout and the clean-up must key on.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, stdout: CappedBuffer, stderr: CappedBuffer) -> None:
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self._sinks = {1: stdout, 2: stderr}

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self._sinks[fd].write(data if isinstance(data, bytes) else data.encode())

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    max_output_bytes: int,
) -> ProcessResult:
    """Run ``argv`` (no shell) in a new process group; kill the group on timeout or cancellation.

    Raises ``OSError`` when the program cannot be started (missing, not executable)
    and ``ValueError`` for arguments the OS cannot take (NUL bytes).
    """
    if not argv:
        raise ValueError("empty command")
    loop = asyncio.get_running_loop()
    stdout = CappedBuffer(max_output_bytes)
    stderr = CappedBuffer(max_output_bytes)
    spawn = asyncio.ensure_future(
        loop.subprocess_exec(
            lambda: _Collector(loop, stdout, stderr),
            *argv,
            cwd=str(cwd),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    )
    try:
        transport, protocol = await asyncio.shield(spawn)
    except asyncio.CancelledError:
        # The child may be running already (the spawn completes after fork): end its group.
        spawn.add_done_callback(_end_spawned)
        with contextlib.suppress(Exception):
            await _settle(spawn, _KILL_GRACE_S)
        raise
    pgid = transport.get_pid()  # the leader of a new session: its pid is the group id
    timed_out = False
    try:
        try:
            await asyncio.wait_for(asyncio.shield(protocol.exited), timeout_s)
        except TimeoutError:
            timed_out = True
        else:
            # Background children may still hold the pipes: give them a moment, then end them.
            await _settle(protocol.closed, _EXIT_GRACE_S)
        _kill_group(pgid)
        await _settle(protocol.exited, _KILL_GRACE_S)
        await _settle(protocol.closed, _KILL_GRACE_S)
    except BaseException:
        # Cancelled (or failed): nothing this call started may survive it.
        _kill_group(pgid)
        with contextlib.suppress(BaseException):
            await _settle(protocol.exited, _KILL_GRACE_S)
        raise
    finally:
        transport.close()
    return ProcessResult(
        argv=tuple(argv),
        exit_code=transport.get_returncode(),
        stdout=stdout,
        stderr=stderr,
        timed_out=timed_out,
        timeout_s=timeout_s,
        max_output_bytes=max_output_bytes,
    )


async def _settle(future: asyncio.Future[Any], within_s: float) -> None:
    """Wait for ``future`` at most ``within_s`` seconds, without cancelling it."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(future), within_s)


def _end_spawned(spawn: asyncio.Future[tuple[asyncio.SubprocessTransport, _Collector]]) -> None:
    if spawn.cancelled() or spawn.exception() is not None:
        return
    transport, _ = spawn.result()
    _kill_group(transport.get_pid())
    transport.close()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def run_sandboxed(
    argv: Sequence[str],
    *,
    settings: ToolSettings,
    env: Mapping[str, str],
    timeout_s: float,
) -> ProcessResult:
    """``run_process`` inside the tool sandbox of ``settings``; nothing it started outlives the call."""
    settings.workspace.mkdir(parents=True, exist_ok=True)
    command = settings.sandbox_command(argv, env)
    try:
        result = await run_process(
            command.argv, cwd=command.cwd, env=command.env, timeout_s=timeout_s,
            max_output_bytes=settings.max_output_bytes,
        )
    finally:
        command.release()
    result.argv = tuple(argv)
    return result
