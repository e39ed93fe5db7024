"""The send_file tool: the path guard, what may be sent, and who may send."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.tools.policy import authorize
from agent.tools.registry import ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSettings
from agent.tools.send_file import SendFileTool
from agent.types import ToolPolicy


class Sender:
    def __init__(self) -> None:
        self.sent: list[tuple[Path, str | None]] = []

    async def __call__(self, path: Path, caption: str | None) -> str:
        self.sent.append((path, caption))
        return f"Sent {path.name}"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def sender() -> Sender:
    return Sender()


@pytest.fixture
def ctx(workspace: Path, tmp_path: Path, sender: Sender) -> ToolContext:
    settings = ToolSettings(workspace=workspace, allowed_paths=(workspace,), denied_paths=(workspace / "secret",))
    return ToolContext(run_id="r", session_key="s", settings=settings, send_file=sender)


async def call(ctx: ToolContext, raw: str) -> ToolOutput:
    """What the agent loop does with a call: validate, execute, turn ToolError into an error result."""
    registry = ToolRegistry([SendFileTool()])
    try:
        return await SendFileTool().execute(registry.parse_arguments("send_file", raw), ctx)
    except ToolError as exc:
        return ToolOutput(str(exc), is_error=True)


async def test_sends_a_file_with_its_caption(ctx: ToolContext, workspace: Path, sender: Sender) -> None:
    (workspace / "r.txt").write_text("report")
    out = await call(ctx, '{"path": "r.txt", "caption": "  here  "}')
    assert (out.is_error, out.content) == (False, "Sent r.txt")
    assert sender.sent == [(workspace / "r.txt", "here")]


@pytest.mark.parametrize(
    ("setup", "path", "message"),
    [
        ("outside", "../outside.txt", "outside the allowed paths"),
        ("link", "link.txt", "outside the allowed paths"),
        ("denied", "secret/key", "denied"),
        ("dir", "folder", "not a regular file"),
        ("empty", "empty.txt", "empty"),
        ("none", "missing.txt", "does not exist"),
    ],
)
async def test_refuses_what_it_must_not_send(
    ctx: ToolContext, workspace: Path, tmp_path: Path, sender: Sender, setup: str, path: str, message: str
) -> None:
    (tmp_path / "outside.txt").write_text("not yours")
    os.symlink(tmp_path / "outside.txt", workspace / "link.txt")
    (workspace / "secret").mkdir()
    (workspace / "secret" / "key").write_text("k")
    (workspace / "folder").mkdir()
    (workspace / "empty.txt").write_text("")
    out = await call(ctx, f'{{"path": "{path}"}}')
    assert out.is_error and message in out.content
    assert sender.sent == []


async def test_without_a_chat_it_says_so(ctx: ToolContext, workspace: Path) -> None:
    (workspace / "r.txt").write_text("report")
    ctx.send_file = None
    out = await call(ctx, '{"path": "r.txt"}')
    assert out.is_error and "no chat to send files to" in out.content


async def test_a_caption_over_the_limit_is_refused_by_the_schema(ctx: ToolContext, workspace: Path) -> None:
    (workspace / "r.txt").write_text("report")
    out = await call(ctx, '{"path": "r.txt", "caption": "' + "x" * 1025 + '"}')
    assert out.is_error and "caption" in out.content


async def test_scheduled_runs_send_only_when_write_is_allowed() -> None:
    tool = SendFileTool()
    assert await authorize(tool, {"path": "x"}, ToolPolicy(context="scheduled"), None) is not None
    assert await authorize(tool, {"path": "x"}, ToolPolicy(context="scheduled", allow=("write",)), None) is None
    assert await authorize(tool, {"path": "x"}, ToolPolicy(context="interactive"), None) is None


def test_the_prompt_says_how_files_arrive_and_how_to_send_one(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from agent.prompt import PromptSpec, build_system_prompt

    def tooling(tools: dict[str, str]) -> str:
        prompt = build_system_prompt(PromptSpec(workspace=tmp_path, now=datetime.now(UTC), tools=tools))
        return prompt.split("## Tooling", 1)[1].split("\n## ", 1)[0]

    with_send = tooling({"read_file": "Read.", "send_file": "Send."})
    assert "[attachment: <absolute path> (<mime type>, <bytes> bytes)]" in with_send
    assert "call send_file with its path" in with_send
    without = tooling({"read_file": "Read."})
    assert "[attachment: " in without and "send_file" not in without
