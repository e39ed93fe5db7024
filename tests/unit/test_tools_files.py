"""read_file, write_file, list_directory and the path guard, against real files and symlinks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.tools.builtin import builtin_tools
from agent.tools.files import ListDirectoryTool, ReadFileTool, WriteFileTool
from agent.tools.paths import PathDeniedError, PathGuard
from agent.tools.registry import ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSettings


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    (ws / "notes").mkdir(parents=True)
    (ws / "notes" / "todo.txt").write_text("one\ntwo\nthree\n")
    (ws / "secret").mkdir()
    (ws / "secret" / "key.txt").write_text("hunter2\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "data.txt").write_text("outside data\n")
    return ws


@pytest.fixture
def ctx(workspace: Path) -> ToolContext:
    settings = ToolSettings(
        workspace=workspace,
        allowed_paths=(workspace,),
        denied_paths=(workspace / "secret",),
        max_read_bytes=1024,
        max_output_bytes=4096,
    )
    return ToolContext(run_id="r", session_key="s", settings=settings)


async def call(ctx: ToolContext, name: str, raw: str) -> ToolOutput:
    """What the agent loop does with a call: validate, execute, turn ToolError into an error result."""
    registry = ToolRegistry(builtin_tools(ctx.settings))
    try:
        args = registry.parse_arguments(name, raw)
        tool = registry.get(name)
        assert tool is not None
        return await tool.execute(args, ctx)
    except ToolError as exc:
        return ToolOutput(str(exc), is_error=True)


async def test_read_a_file_relative_to_the_workspace(ctx: ToolContext) -> None:
    out = await call(ctx, "read_file", '{"path": "notes/todo.txt"}')
    assert out == ToolOutput("one\ntwo\nthree\n")


async def test_read_pages_with_offset_and_limit(ctx: ToolContext) -> None:
    out = await call(ctx, "read_file", '{"path": "notes/todo.txt", "offset": 2, "limit": 1}')
    assert not out.is_error
    assert out.content.splitlines()[0] == "two"
    assert "read on with offset=3" in out.content
    last = await call(ctx, "read_file", '{"path": "notes/todo.txt", "offset": 3, "limit": 5}')
    assert last.content == "three\n"
    past = await call(ctx, "read_file", '{"path": "notes/todo.txt", "offset": 9}')
    assert past.is_error and "past the end" in past.content and "(3 lines)" in past.content


async def test_large_file_is_cut_at_max_read_bytes(ctx: ToolContext, workspace: Path) -> None:
    lines = [f"line {i:04d} " + "x" * 40 for i in range(1, 201)]
    (workspace / "big.txt").write_text("\n".join(lines) + "\n")
    out = await call(ctx, "read_file", '{"path": "big.txt"}')
    assert not out.is_error
    assert out.content.startswith("line 0001 ")
    assert len(out.content.encode()) < ctx.settings.max_read_bytes + 200
    assert "was cut at the 1024-byte limit" in out.content
    next_offset = int(out.content.rsplit("offset=", 1)[1].rstrip("]"))
    more = await call(ctx, "read_file", f'{{"path": "big.txt", "offset": {next_offset}, "limit": 2}}')
    assert more.content.startswith(f"line {next_offset:04d} ")


async def test_read_errors_are_clear(ctx: ToolContext, workspace: Path) -> None:
    (workspace / "binary.bin").write_bytes(b"abc\x00def")
    (workspace / "latin1.txt").write_bytes("café".encode("latin-1"))
    (workspace / "empty.txt").write_text("")
    missing = await call(ctx, "read_file", '{"path": "nope.txt"}')
    assert missing.is_error and "does not exist" in missing.content
    directory = await call(ctx, "read_file", '{"path": "notes"}')
    assert directory.is_error and "is a directory" in directory.content
    binary = await call(ctx, "read_file", '{"path": "binary.bin"}')
    assert binary.is_error and "binary" in binary.content
    latin = await call(ctx, "read_file", '{"path": "latin1.txt"}')
    assert latin.is_error and "not valid UTF-8" in latin.content and "offset 3" in latin.content
    empty = await call(ctx, "read_file", '{"path": "empty.txt"}')
    assert not empty.is_error and "is empty" in empty.content


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads everything")
async def test_permission_denied_is_reported(ctx: ToolContext, workspace: Path) -> None:
    locked = workspace / "locked.txt"
    locked.write_text("x")
    locked.chmod(0)
    try:
        out = await call(ctx, "read_file", '{"path": "locked.txt"}')
    finally:
        locked.chmod(0o600)
    assert out.is_error and "permission denied" in out.content


@pytest.fixture
def unwritable_dir(workspace: Path) -> Path:
    if os.geteuid() == 0:  # root may write anywhere on disk, but not create files in sysfs
        if not os.path.isdir("/sys/kernel"):
            pytest.skip("no sysfs")
        return Path("/sys/kernel")
    target = workspace / "read-only"
    target.mkdir()
    target.chmod(0o500)
    return target


async def test_permission_denied_writing_is_reported(workspace: Path, unwritable_dir: Path) -> None:
    settings = ToolSettings(workspace=workspace, allowed_paths=(workspace, unwritable_dir))
    ctx = ToolContext(run_id="r", session_key="s", settings=settings)
    target = unwritable_dir / "botd-test.txt"
    out = await call(ctx, "write_file", f'{{"path": "{target}", "content": "x"}}')
    assert out.is_error and "permission denied" in out.content, out.content
    assert not (unwritable_dir / "botd-test.txt").exists()


async def test_read_outside_allowed_paths_is_denied(ctx: ToolContext, tmp_path: Path) -> None:
    for raw in [str(tmp_path / "outside" / "data.txt"), "../outside/data.txt", "/etc/hostname", "~/.bashrc"]:
        out = await call(ctx, "read_file", f'{{"path": "{raw}"}}')
        assert out.is_error and "outside the allowed paths" in out.content, raw


async def test_denied_path_inside_an_allowed_one_is_denied(ctx: ToolContext, workspace: Path) -> None:
    write = await call(ctx, "write_file", '{"path": "secret/new.txt", "content": "x"}')
    assert write.is_error and "denied" in write.content
    assert not (workspace / "secret" / "new.txt").exists()
    read = await call(ctx, "read_file", '{"path": "notes/../secret/key.txt"}')
    assert read.is_error and "denied" in read.content
    listing = await call(ctx, "list_directory", '{"path": "secret"}')
    assert listing.is_error


async def test_symlink_pointing_outside_is_denied(ctx: ToolContext, workspace: Path, tmp_path: Path) -> None:
    (workspace / "escape").symlink_to(tmp_path / "outside")
    (workspace / "escape_file").symlink_to(tmp_path / "outside" / "data.txt")
    (workspace / "to_secret").symlink_to(workspace / "secret")
    for raw in ["escape/data.txt", "escape_file", "to_secret/key.txt"]:
        out = await call(ctx, "read_file", f'{{"path": "{raw}"}}')
        assert out.is_error, raw
    write = await call(ctx, "write_file", '{"path": "escape/planted.txt", "content": "x"}')
    assert write.is_error
    assert not (tmp_path / "outside" / "planted.txt").exists()
    overwrite = await call(ctx, "write_file", '{"path": "escape_file", "content": "x"}')
    assert overwrite.is_error
    assert (tmp_path / "outside" / "data.txt").read_text() == "outside data\n"


async def test_symlink_inside_the_workspace_is_followed(ctx: ToolContext, workspace: Path) -> None:
    (workspace / "alias").symlink_to(workspace / "notes")
    out = await call(ctx, "read_file", '{"path": "alias/todo.txt"}')
    assert out.content == "one\ntwo\nthree\n"


async def test_write_is_atomic_creates_parents_and_keeps_the_mode(ctx: ToolContext, workspace: Path) -> None:
    out = await call(ctx, "write_file", '{"path": "deep/er/file.txt", "content": "héllo\\n"}')
    assert not out.is_error, out.content
    target = workspace / "deep" / "er" / "file.txt"
    assert target.read_text() == "héllo\n"
    assert "7 bytes" in out.content
    target.chmod(0o640)
    again = await call(ctx, "write_file", '{"path": "deep/er/file.txt", "content": "new"}')
    assert not again.is_error
    assert target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in target.parent.iterdir()] == ["file.txt"]  # no temp files left behind


async def test_write_errors_are_clear(ctx: ToolContext, workspace: Path) -> None:
    onto_dir = await call(ctx, "write_file", '{"path": "notes", "content": "x"}')
    assert onto_dir.is_error and "is a directory" in onto_dir.content
    under_file = await call(ctx, "write_file", '{"path": "notes/todo.txt/child", "content": "x"}')
    assert under_file.is_error and "not a directory" in under_file.content
    assert (workspace / "notes" / "todo.txt").read_text() == "one\ntwo\nthree\n"
    surrogate = await call(ctx, "write_file", '{"path": "a.txt", "content": "\\ud800"}')
    assert surrogate.is_error and "not valid Unicode" in surrogate.content
    bad_args = await call(ctx, "write_file", '{"path": "a.txt"}')
    assert bad_args.is_error and "content" in bad_args.content


async def test_home_is_expanded(tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(workspace))
    settings = ToolSettings(workspace=workspace, allowed_paths=(workspace,))
    ctx = ToolContext(run_id="r", session_key="s", settings=settings)
    out = await ReadFileTool().execute({"path": "~/notes/todo.txt"}, ctx)
    assert out.content == "one\ntwo\nthree\n"


async def test_list_directory(ctx: ToolContext, workspace: Path) -> None:
    (workspace / "alias").symlink_to(workspace / "notes")
    out = await ListDirectoryTool().execute({}, ctx)
    # The denied directory is left out of the listing: a tool never sees botd's own files.
    assert out.content.splitlines() == ["alias -> " + str(workspace / "notes"), "notes/"]
    notes = await ListDirectoryTool().execute({"path": "notes"}, ctx)
    assert notes.content == "todo.txt  (14 bytes)"
    with pytest.raises(ToolError, match="is a file"):
        await ListDirectoryTool().execute({"path": "notes/todo.txt"}, ctx)
    with pytest.raises(ToolError, match="does not exist"):
        await ListDirectoryTool().execute({"path": "nowhere"}, ctx)


async def test_write_then_read_round_trip(ctx: ToolContext) -> None:
    content = "line 1\nünïcödé ✓\n"
    await WriteFileTool().execute({"path": "round.txt", "content": content}, ctx)
    out = await ReadFileTool().execute({"path": "round.txt"}, ctx)
    assert out.content == content


def test_guard_rejects_bad_path_strings(workspace: Path) -> None:
    guard = PathGuard(workspace)
    for raw, reason in [("", "empty"), ("a\x00b", "NUL"), ("a" * 5000, "longer"), ("\udc80", "UTF-8")]:
        with pytest.raises(PathDeniedError, match=reason):
            guard.resolve(raw)


@dataclass
class Sandbox:
    workspace: Path
    guard: PathGuard
    allowed: list[Path]
    denied: list[Path]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Sandbox:
    root = tmp_path_factory.mktemp("pathguard")
    ws = root / "ws"
    (ws / "sub" / "deeper").mkdir(parents=True)
    (ws / "secret").mkdir()
    (root / "outside").mkdir()
    (ws / "link_out").symlink_to(root / "outside")
    (ws / "link_etc").symlink_to("/etc")
    (ws / "link_in").symlink_to(ws / "sub")
    (ws / "link_secret").symlink_to(ws / "secret")
    (ws / "sub" / "up").symlink_to("../..")
    (ws / "loop").symlink_to(ws / "loop")
    allowed, denied = [ws], [ws / "secret"]
    return Sandbox(ws, PathGuard(ws, allowed, denied), allowed, denied)


SEGMENTS = st.sampled_from(
    ["..", ".", "~", "~root", "", "sub", "deeper", "link_out", "link_etc", "link_in", "link_secret", "up", "loop",
     "secret", "x", "/", "/etc", "/tmp", "WORKSPACE", "a\x00b", "é", "x" * 255]
)  # fmt: skip


def _inside(path: Path, roots: list[Path]) -> bool:
    real_roots = [Path(os.path.realpath(r)) for r in roots]
    return any(path == r or path.is_relative_to(r) for r in real_roots)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.lists(SEGMENTS, max_size=12).map("/".join), st.text(max_size=300)))
def test_random_paths_never_escape_the_allowed_roots(sandbox: Sandbox, raw: str) -> None:
    raw = raw.replace("WORKSPACE", str(sandbox.workspace))
    try:
        resolved = sandbox.guard.resolve(raw)
    except PathDeniedError as exc:
        assert str(exc).startswith("Error:")
        return
    assert resolved.is_absolute()
    assert Path(os.path.realpath(resolved)) == resolved  # nothing left to resolve
    assert _inside(resolved, sandbox.allowed)
    assert not _inside(resolved, sandbox.denied)
