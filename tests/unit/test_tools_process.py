"""run_process: process groups, timeouts, cancellation and the output cap, with real processes."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from agent.tools.environment import subprocess_env
from agent.tools.process import CappedBuffer, run_process

# Starts two children and a grandchild, records every pid, and waits on them.
SPAWN_TREE = (
    "echo $$ >> pids; "
    "sleep 60 & echo $! >> pids; "
    "bash -c 'sleep 60 & echo $! >> pids; wait' & echo $! >> pids; "
    "sleep 60; wait"
)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_all_gone(pids: list[int], within_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within_s
    alive = [p for p in pids if not gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if not gone(p)]
    return alive


def read_pids(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [int(line) for line in path.read_text().split()]


def env() -> dict[str, str]:
    return subprocess_env(["PATH", "HOME", "LANG"])


async def test_runs_a_program_and_reports_output_and_exit_code(tmp_path: Path) -> None:
    result = await run_process(
        ["bash", "-c", "echo out; echo err >&2; exit 3"],
        cwd=tmp_path,
        env=env(),
        timeout_s=30,
        max_output_bytes=10_000,
    )
    assert result.exit_code == 3
    assert not result.ok
    text = result.render()
    assert "out" in text
    assert "[stderr]\nerr" in text
    assert "[exit code: 3]" in text


async def test_runs_in_the_given_directory(tmp_path: Path) -> None:
    result = await run_process(["pwd"], cwd=tmp_path, env=env(), timeout_s=30, max_output_bytes=10_000)
    assert result.ok
    assert result.render().splitlines()[0] == str(tmp_path)


async def test_output_over_the_cap_is_truncated_with_a_notice(tmp_path: Path) -> None:
    result = await run_process(
        [sys.executable, "-c", "import sys; sys.stdout.write('a' * 50000 + 'END')"],
        cwd=tmp_path,
        env=env(),
        timeout_s=30,
        max_output_bytes=2048,
    )
    text = result.render()
    assert result.ok
    assert f"[output truncated: {50003 - 2048} of 50003 bytes]" in text
    assert text.startswith("a" * 100)
    assert "END" in text  # the tail is kept too
    assert len(text.encode()) < 2048 + 200


async def test_missing_program_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        await run_process(
            [str(tmp_path / "no-such-program")], cwd=tmp_path, env=env(), timeout_s=5, max_output_bytes=1024
        )


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    started = time.monotonic()
    result = await run_process(
        ["bash", "-c", SPAWN_TREE], cwd=tmp_path, env=env(), timeout_s=1.5, max_output_bytes=1024
    )
    assert time.monotonic() - started < 30  # far below the 60 s the children would sleep
    assert result.timed_out
    assert "[timed out after 1.5 s; the process group was killed]" in result.render()
    pids = read_pids(tmp_path / "pids")
    assert len(pids) == 4
    assert wait_all_gone(pids) == []


async def test_background_children_do_not_outlive_the_call(tmp_path: Path) -> None:
    result = await run_process(
        ["bash", "-c", "sleep 60 & echo $! > pids; echo done"],
        cwd=tmp_path,
        env=env(),
        timeout_s=30,
        max_output_bytes=1024,
    )
    assert result.ok
    assert "done" in result.render()
    assert wait_all_gone(read_pids(tmp_path / "pids")) == []


async def test_cancellation_kills_the_process_group(tmp_path: Path) -> None:
    task = asyncio.create_task(
        run_process(["bash", "-c", SPAWN_TREE], cwd=tmp_path, env=env(), timeout_s=60, max_output_bytes=1024)
    )
    pid_file = tmp_path / "pids"
    for _ in range(400):
        if len(read_pids(pid_file)) == 4:
            break
        await asyncio.sleep(0.025)
    pids = read_pids(pid_file)
    assert len(pids) == 4
    assert all(not gone(p) for p in pids)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert wait_all_gone(pids) == []


async def test_environment_is_exactly_what_is_given(tmp_path: Path) -> None:
    result = await run_process(
        ["/usr/bin/env"], cwd=tmp_path, env={"ONLY": "this"}, timeout_s=10, max_output_bytes=10_000
    )
    assert result.render().splitlines()[0] == "ONLY=this"
    assert len(result.render().splitlines()) == 2  # ONLY=this and the exit code line


def test_capped_buffer_keeps_head_and_tail_and_counts_everything() -> None:
    buffer = CappedBuffer(10)
    for chunk in (b"0123", b"4567", b"89ab", b"cdef"):
        buffer.write(chunk)
    assert buffer.total == 16
    assert buffer.render(10) == "01234\n[output truncated: 6 of 16 bytes]\nbcdef"
    assert buffer.render(4) == "01\n[output truncated: 12 of 16 bytes]\nef"


def test_capped_buffer_below_the_cap_is_verbatim() -> None:
    buffer = CappedBuffer(100)
    buffer.write("héllo\n".encode())
    assert buffer.render(100) == "héllo\n"


def test_subprocess_env_copies_only_allowlisted_names_then_declared() -> None:
    source = {"PATH": "/bin", "OPENAI_API_KEY": "sk-secret", "HOME": "/home/x"}
    out = subprocess_env(["PATH", "LANG"], {"TOOL_VAR": "1", "PATH": "/opt/bin"}, source=source)
    assert out == {"PATH": "/opt/bin", "TOOL_VAR": "1"}
    assert os.environ is not source


async def test_cancellation_at_any_moment_of_start_up_leaves_nothing_behind(tmp_path: Path) -> None:
    """Cancel as early as possible, repeatedly: also while the spawn itself is still completing."""
    pid_file = tmp_path / "pids"
    for attempt in range(20):
        pid_file.unlink(missing_ok=True)
        task = asyncio.create_task(
            run_process(
                ["bash", "-c", SPAWN_TREE], cwd=tmp_path, env=env(), timeout_s=60, max_output_bytes=1024
            )
        )
        if attempt % 2:
            while not pid_file.exists():
                await asyncio.sleep(0.001)
        else:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)  # a child forked just before the kill may still record its pid
        assert wait_all_gone(read_pids(pid_file)) == [], attempt
