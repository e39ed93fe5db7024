"""``workspace_scope: user``: what the file tools of one session may read and write, and seeding."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.tools.files import ListDirectoryTool, ReadFileTool, WriteFileTool
from agent.tools.registry import ToolContext, ToolError, ToolSettings
from agent.types import RunRequest
from bot.workspaces import SessionWorkspaces


def dm(user: str) -> RunRequest:
    return RunRequest(session_key=f"agent:main:test:dm:{user}", agent_id="main", channel="test", chat_id=user,
                      user_id=user, user_name=user, text="hi")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "IDENTITY.md").write_text("I am the bot.\n")
    (ws / "tools.yaml").write_text("tools: []\n")
    (ws / ".botd").mkdir()
    (ws / ".botd" / "valkey.pass").write_text("store-password\n")
    return ws


def context(root: Path, user: str) -> ToolContext:
    base = ToolSettings(workspace=root, allowed_paths=(root,), denied_paths=(root / ".botd",))
    settings = SessionWorkspaces(base, "user").settings_for(dm(user))
    return ToolContext(run_id="r", session_key=f"s-{user}", settings=settings)


async def test_the_roots_own_files_are_readable_never_writable(root: Path) -> None:
    bob = context(root, "bob")
    for path in ("../../IDENTITY.md", str(root / "IDENTITY.md")):
        assert (await ReadFileTool().execute({"path": path}, bob)).content == "I am the bot.\n"
    assert "tools: []" in (await ReadFileTool().execute({"path": str(root / "tools.yaml")}, bob)).content
    for target in ("../../IDENTITY.md", str(root / "SOUL.md"), str(root / "tools.yaml")):
        with pytest.raises(ToolError, match="outside the allowed paths"):
            await WriteFileTool().execute({"path": target, "content": "hacked"}, bob)
    assert (root / "IDENTITY.md").read_text() == "I am the bot.\n" and not (root / "SOUL.md").exists()
    await WriteFileTool().execute({"path": "notes.md", "content": "mine"}, bob)
    assert (root / "users" / "test-bob" / "notes.md").read_text() == "mine"


async def test_other_sessions_and_botds_files_stay_invisible(root: Path) -> None:
    alice = context(root, "alice")
    await WriteFileTool().execute({"path": "diary.txt", "content": "alice's secret"}, alice)
    chat = root / "chats" / "test-group"
    chat.mkdir(parents=True)
    (chat / "plan.txt").write_text("group plan")
    bob = context(root, "bob")
    for path in ("../test-alice/diary.txt", str(root / "users" / "test-alice" / "diary.txt"),
                 str(chat / "plan.txt"), "../../users/test-alice/../test-alice/diary.txt"):
        with pytest.raises(ToolError, match="not visible here"):
            await ReadFileTool().execute({"path": path}, bob)
    for directory in (str(root / "users"), str(root / "chats"), ".."):
        with pytest.raises(ToolError, match="not visible here"):
            await ListDirectoryTool().execute({"path": directory}, bob)
    with pytest.raises(ToolError, match="denied"):
        await ReadFileTool().execute({"path": str(root / ".botd" / "valkey.pass")}, bob)
    listing = (await ListDirectoryTool().execute({"path": str(root)}, bob)).content.splitlines()
    assert "IDENTITY.md  (14 bytes)" in listing
    assert not [line for line in listing if line.startswith(("users", "chats", ".botd"))]
    # A link in bob's own directory is judged by where it points.
    os.symlink(root / "users" / "test-alice" / "diary.txt", root / "users" / "test-bob" / "peek")
    with pytest.raises(ToolError, match="not visible here"):
        await ReadFileTool().execute({"path": "peek"}, bob)


async def test_shared_scope_keeps_one_writable_workspace(root: Path) -> None:
    base = ToolSettings(workspace=root, allowed_paths=(root,), denied_paths=(root / ".botd",))
    ctx = ToolContext(run_id="r", session_key="s", settings=SessionWorkspaces(base, "shared").settings_for(dm("x")))
    await WriteFileTool().execute({"path": "IDENTITY.md", "content": "changed"}, ctx)
    assert (root / "IDENTITY.md").read_text() == "changed"


def test_seeding_copies_user_md_once_and_never_overwrites(root: Path) -> None:
    (root / "USER.md").write_text("# About you\n")
    base = ToolSettings(workspace=root)
    SessionWorkspaces(base, "user").settings_for(dm("carol"))
    seeded = root / "users" / "test-carol" / "USER.md"
    assert seeded.read_text() == "# About you\n" and (seeded.stat().st_mode & 0o777) == 0o600
    seeded.write_text("Carol likes tea.\n")
    (root / "USER.md").write_text("# A new template\n")
    SessionWorkspaces(base, "user").settings_for(dm("carol"))  # a restart, or another replica
    assert seeded.read_text() == "Carol likes tea.\n"
    assert [p.name for p in seeded.parent.iterdir()] == ["USER.md"]  # no stray temporary file


def test_seeding_follows_no_link(root: Path, tmp_path: Path) -> None:
    (root / "USER.md").write_text("template\n")
    victim = tmp_path / "victim.txt"
    session = root / "users" / "test-dave"
    session.mkdir(parents=True)
    (session / "USER.md").symlink_to(victim)  # dangling: a tool planted it before a restart
    SessionWorkspaces(ToolSettings(workspace=root), "user").settings_for(dm("dave"))
    assert not victim.exists() and (session / "USER.md").is_symlink()

    elsewhere = tmp_path / "daemon-secret"
    elsewhere.write_text("secret\n")
    (root / "USER.md").unlink()
    (root / "USER.md").symlink_to(elsewhere)  # a linked template is not copied into sessions
    SessionWorkspaces(ToolSettings(workspace=root), "user").settings_for(dm("erin"))
    assert not (root / "users" / "test-erin" / "USER.md").exists()


def test_settings_are_kept_for_a_bounded_number_of_sessions(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bot.workspaces._CACHE_SIZE", 3)
    base = ToolSettings(workspace=root, allowed_paths=(root,), denied_paths=(root / ".botd",))
    spaces = SessionWorkspaces(base, "user")
    first = spaces.settings_for(dm("u0"))
    for i in range(1, 6):
        spaces.settings_for(dm(f"u{i}"))
    assert len(spaces._cache) == 3  # the daemon's memory does not grow with the sessions it served
    again = spaces.settings_for(dm("u0"))  # forgotten: rebuilt, the same as before
    assert again is not first and again == first
    assert spaces.settings_for(dm("u0")) is again  # and kept again
    assert (root / "users" / "test-u0").is_dir()
