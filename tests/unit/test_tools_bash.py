"""The bash tool end to end: real bash, real files, the registry's validation in front."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psutil
import pytest

from agent.tools.bash import BashTool
from agent.tools.builtin import builtin_tools
from agent.tools.registry import ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSettings

SECRETS = {
    "OPENAI_API_KEY": "sk-test-openai-5f1c",
    "TELEGRAM_BOT_TOKEN": "123456:telegram-secret-token",
    "SLACK_BOT_TOKEN": "xoxb-slack-secret",
    "SLACK_APP_TOKEN": "xapp-slack-secret",
    "SLACK_SIGNING_SECRET": "slack-signing-secret",
    "REDIS_URL": "redis://:password@127.0.0.1:6379/0",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
}


@pytest.fixture
def settings(tmp_path: Path) -> ToolSettings:
    workspace = tmp_path / "workspace"
    return ToolSettings(
        workspace=workspace,
        allowed_paths=(workspace,),
        timeout_s=20,
        max_output_bytes=4096,
    )


@pytest.fixture
def ctx(settings: ToolSettings) -> ToolContext:
    return ToolContext(run_id="run-1", session_key="agent:main:test:dm:1", settings=settings)


async def call(registry: ToolRegistry, ctx: ToolContext, name: str, raw: str) -> ToolOutput:
    """What the agent loop does with a call: validate, execute, turn ToolError into an error result."""
    try:
        args = registry.parse_arguments(name, raw)
        tool = registry.get(name)
        assert tool is not None
        return await tool.execute(args, ctx)
    except ToolError as exc:
        return ToolOutput(str(exc), is_error=True)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_valid_call_runs_in_the_workspace(settings: ToolSettings, ctx: ToolContext) -> None:
    registry = ToolRegistry(builtin_tools(settings))
    out = await call(registry, ctx, "bash", '{"command": "pwd; echo hello > greeting.txt; cat greeting.txt"}')
    assert not out.is_error, out.content
    assert out.content.splitlines()[0] == str(settings.workspace)
    assert "hello" in out.content
    assert "[exit code: 0]" in out.content
    assert (settings.workspace / "greeting.txt").read_text() == "hello\n"


async def test_non_zero_exit_is_an_error_with_output_and_stderr(
    settings: ToolSettings, ctx: ToolContext
) -> None:
    registry = ToolRegistry(builtin_tools(settings))
    out = await call(registry, ctx, "bash", '{"command": "echo partial; ls /no/such/dir; exit 2"}')
    assert out.is_error
    assert "partial" in out.content
    assert "[stderr]" in out.content and "No such file or directory" in out.content
    assert "[exit code: 2]" in out.content


@pytest.mark.parametrize(
    "raw",
    [
        '{"command": 5}',
        "{}",
        '{"command": ""}',
        '{"command": "ls", "extra": 1}',
        '{"command": "ls", "timeout_s": 99999}',
        '{"command": "ls", "timeout_s": -1}',
        "not json",
        '["ls"]',
    ],
)
async def test_invalid_parameters_come_back_as_validation_errors(
    settings: ToolSettings, ctx: ToolContext, raw: str
) -> None:
    registry = ToolRegistry(builtin_tools(settings))
    with pytest.raises(ToolError, match="Error:"):
        registry.parse_arguments("bash", raw)
    out = await call(registry, ctx, "bash", raw)
    assert out.is_error


async def test_output_over_the_cap_is_truncated_with_notice(settings: ToolSettings, ctx: ToolContext) -> None:
    tool = BashTool(settings)
    out = await tool.execute({"command": "head -c 100000 /dev/zero | tr '\\0' x; echo; echo LAST"}, ctx)
    assert not out.is_error
    assert "[output truncated: " in out.content
    assert "of 100006 bytes]" in out.content
    assert "LAST" in out.content
    assert len(out.content.encode()) < settings.max_output_bytes + 200


async def test_timeout_kills_sleep_and_its_children(tmp_path: Path, settings: ToolSettings) -> None:
    ctx = ToolContext(
        run_id="r", session_key="s", settings=ToolSettings(workspace=settings.workspace, timeout_s=1.5)
    )
    tool = BashTool(ctx.settings)
    command = "echo $$ > pids; sleep 60 & echo $! >> pids; sleep 60 & echo $! >> pids; wait"
    started = time.monotonic()
    out = await tool.execute({"command": command}, ctx)
    assert time.monotonic() - started < 30
    assert out.is_error
    assert "timed out after 1.5 s" in out.content
    pids = [int(p) for p in (settings.workspace / "pids").read_text().split()]
    assert len(pids) == 3
    for _ in range(200):
        if all(gone(p) for p in pids):
            break
        await asyncio.sleep(0.05)
    assert [p for p in pids if not gone(p)] == []


async def test_model_can_ask_for_a_shorter_timeout(settings: ToolSettings, ctx: ToolContext) -> None:
    out = await BashTool(settings).execute({"command": "sleep 30", "timeout_s": 0.5}, ctx)
    assert out.is_error
    assert "timed out after 0.5 s" in out.content


async def test_cancelling_the_task_kills_the_process_group(settings: ToolSettings, ctx: ToolContext) -> None:
    tool = BashTool(settings)
    command = "echo $$ > pids; sleep 60 & echo $! >> pids; (sleep 60 & echo $! >> pids; wait) & wait"
    task = asyncio.create_task(tool.execute({"command": command}, ctx))
    pid_file = settings.workspace / "pids"
    for _ in range(400):
        if pid_file.exists() and len(pid_file.read_text().split()) == 3:
            break
        await asyncio.sleep(0.025)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 3 and not any(gone(p) for p in pids)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if all(gone(p) for p in pids):
            break
        await asyncio.sleep(0.05)
    assert [p for p in pids if not gone(p)] == []


async def test_subprocess_env_has_no_keys_or_tokens(
    settings: ToolSettings, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    out = await BashTool(settings).execute({"command": "env"}, ctx)
    assert not out.is_error
    for name, value in SECRETS.items():
        assert name not in out.content
        assert value not in out.content
    names = {line.split("=", 1)[0] for line in out.content.splitlines() if "=" in line}
    # Only the allowlist, plus what bash itself sets.
    assert names <= set(settings.env_allowlist) | {"PWD", "SHLVL", "_", "OLDPWD"}
    assert "PATH" in names


async def test_blocked_command_is_refused_and_runs_nothing(settings: ToolSettings, ctx: ToolContext) -> None:
    registry = ToolRegistry(builtin_tools(settings))
    out = await call(registry, ctx, "bash", '{"command": "touch marker; rm -rf /"}')
    assert out.is_error
    assert "blocked" in out.content and "`rm`" in out.content
    assert not (settings.workspace / "marker").exists()


def test_builtin_tool_names_and_categories(settings: ToolSettings) -> None:
    tools = {t.name: t.category for t in builtin_tools(settings)}
    assert tools == {
        "bash": "write", "read_file": "read", "write_file": "write", "list_directory": "read", "send_file": "write",
    }
