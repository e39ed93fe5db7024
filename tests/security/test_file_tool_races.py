"""File tools against a hostile workspace: swapped links, hard links, planted roots, botd's files."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from pathlib import Path

import pytest

from agent.tools.files import ListDirectoryTool, ReadFileTool, WriteFileTool
from agent.tools.registry import ToolContext, ToolError, ToolOutput, ToolSettings

SECRET = "top-secret-daemon-value"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    workspace = tmp_path / "workspace"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "sub" / "note.txt").write_text("harmless\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "note.txt").write_text(SECRET + "\n")
    return workspace, outside


def context(workspace: Path, *allowed: Path, denied: tuple[Path, ...] = ()) -> ToolContext:
    settings = ToolSettings(workspace=workspace, allowed_paths=(workspace, *allowed), denied_paths=denied)
    return ToolContext(run_id="r", session_key="s", settings=settings)


async def run(tool: ReadFileTool | WriteFileTool | ListDirectoryTool, ctx: ToolContext, **args: str) -> ToolOutput:
    try:
        return await tool.execute(args, ctx)
    except ToolError as exc:
        return ToolOutput(str(exc), is_error=True)


async def test_a_directory_swapped_for_a_link_after_the_check_is_not_followed(layout: tuple[Path, Path]) -> None:
    workspace, outside = layout
    ctx = context(workspace)
    checked = ctx.settings.path_guard.resolve("sub/note.txt")
    (workspace / "sub").rename(workspace / "sub.old")
    (workspace / "sub").symlink_to(outside)
    from agent.tools.files import _read_text, _write_atomically

    with pytest.raises(ToolError) as read_error:
        _read_text(checked, "sub/note.txt", 1, None, 10_000)
    assert SECRET not in str(read_error.value)
    with pytest.raises(ToolError):
        _write_atomically(checked, "sub/note.txt", b"overwritten")
    assert (outside / "note.txt").read_text() == SECRET + "\n"


async def test_reads_racing_a_link_flipper_never_see_outside(layout: tuple[Path, Path]) -> None:
    workspace, outside = layout
    ctx = context(workspace)
    stop = threading.Event()

    def flip() -> None:
        sub, parked = workspace / "sub", workspace / "sub.real"
        while not stop.is_set():
            # A write may recreate "sub" while it is parked: the flipper just carries on.
            with contextlib.suppress(OSError):
                os.rename(sub, parked)
                os.symlink(outside, sub)
                os.unlink(sub)
                os.rename(parked, sub)

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        seen = [await run(ReadFileTool(), ctx, path="sub/note.txt") for _ in range(300)]
        await asyncio.gather(*(run(WriteFileTool(), ctx, path="sub/note.txt", content="mine") for _ in range(50)))
    finally:
        stop.set()
        flipper.join()
    assert not any(SECRET in out.content for out in seen)
    assert (outside / "note.txt").read_text() == SECRET + "\n"


async def test_a_hard_link_to_a_hidden_file_is_not_read(layout: tuple[Path, Path], tmp_path: Path) -> None:
    workspace, _ = layout
    state = workspace / ".botd"
    state.mkdir()
    (state / "valkey.pass").write_text(SECRET)
    os.link(state / "valkey.pass", workspace / "innocent.txt")
    out = await run(ReadFileTool(), context(workspace, denied=(state,)), path="innocent.txt")
    assert out.is_error and "hard links" in out.content
    assert SECRET not in out.content


async def test_a_link_planted_at_a_missing_root_does_not_widen_it(layout: tuple[Path, Path], tmp_path: Path) -> None:
    workspace, outside = layout
    scratch = tmp_path / "scratch"  # an allowed root that does not exist yet
    ctx = context(workspace, scratch)
    assert ctx.settings.path_guard.allowed  # built at start-up, like the daemon does
    scratch.symlink_to(outside)  # what a tool process would plant
    out = await run(ReadFileTool(), ctx, path=str(scratch / "note.txt"))
    assert out.is_error and SECRET not in out.content


async def test_botd_files_are_denied_whatever_the_allowed_paths(tmp_path: Path) -> None:
    from bot.config import BotdConfig
    from bot.sandboxing import hidden_paths

    workspace = tmp_path / "ws"
    (workspace / ".botd").mkdir(parents=True)
    (workspace / ".botd" / "daemon.key").write_text(SECRET)
    config_file = workspace / "botd.yaml"
    config_file.write_text(f"# {SECRET}\n")
    cfg = BotdConfig.model_validate({"agent": {"workspace": str(workspace)}, "security": {"allowed_paths": ["/"]}})
    cfg.source = config_file
    settings = ToolSettings(workspace=workspace, allowed_paths=(Path("/"),), denied_paths=tuple(hidden_paths(cfg)))
    ctx = ToolContext(run_id="r", session_key="s", settings=settings)
    for path in (".botd/daemon.key", "botd.yaml", str(config_file)):
        out = await run(ReadFileTool(), ctx, path=path)
        assert out.is_error and SECRET not in out.content
    out = await run(WriteFileTool(), ctx, path=".botd/planted", content="x")
    assert out.is_error and not (workspace / ".botd" / "planted").exists()
