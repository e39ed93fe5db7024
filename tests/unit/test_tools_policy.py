"""Who may run which tool category, through agent.tools.policy.authorize with the real tools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.tools.builtin import builtin_tools
from agent.tools.cli_tools import load_cli_tools
from agent.tools.policy import authorize
from agent.tools.registry import Tool, ToolSettings
from agent.types import ToolPolicy

INTERACTIVE = ToolPolicy(context="interactive")
SCHEDULED = ToolPolicy(context="scheduled")


@pytest.fixture
def tools(tmp_path: Path) -> dict[str, Tool]:
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - name: restart_service\n    category: admin\n    cmd: env\n")
    settings = ToolSettings(workspace=tmp_path / "workspace")
    return {t.name: t for t in [*builtin_tools(settings), *load_cli_tools(path)]}


class Approver:
    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, name: str, args: dict[str, Any]) -> bool:
        self.asked.append((name, args))
        return self.answer


async def test_read_is_always_allowed(tools: dict[str, Tool]) -> None:
    for policy in (INTERACTIVE, SCHEDULED):
        assert await authorize(tools["read_file"], {"path": "x"}, policy, None) is None


async def test_write_in_a_scheduled_run_only_when_listed(tools: dict[str, Tool]) -> None:
    reason = await authorize(tools["bash"], {"command": "ls"}, SCHEDULED, None)
    assert reason is not None and "not allowed in a scheduled run" in reason and "'write'" in reason
    listed = ToolPolicy(context="scheduled", allow=("write",))
    assert await authorize(tools["bash"], {"command": "ls"}, listed, None) is None
    assert await authorize(tools["write_file"], {"path": "a", "content": ""}, listed, None) is None


async def test_admin_in_a_scheduled_run_blocked_unless_listed(tools: dict[str, Tool]) -> None:
    approver = Approver(True)
    reason = await authorize(tools["restart_service"], {}, SCHEDULED, approver)
    assert reason is not None and "'admin'" in reason
    only_write = ToolPolicy(context="scheduled", allow=("write",))
    assert await authorize(tools["restart_service"], {}, only_write, approver) is not None
    listed = ToolPolicy(context="scheduled", allow=("write", "admin"))
    assert await authorize(tools["restart_service"], {}, listed, approver) is None
    assert approver.asked == []  # nobody is asked in a scheduled run


async def test_write_in_an_interactive_run_is_auto_approved(tools: dict[str, Tool]) -> None:
    approver = Approver(False)
    assert await authorize(tools["bash"], {"command": "ls"}, INTERACTIVE, approver) is None
    assert approver.asked == []


async def test_admin_in_an_interactive_run_asks_the_approver(tools: dict[str, Tool]) -> None:
    yes = Approver(True)
    assert await authorize(tools["restart_service"], {"unit": "web"}, INTERACTIVE, yes) is None
    assert yes.asked == [("restart_service", {"unit": "web"})]
    no = Approver(False)
    reason = await authorize(tools["restart_service"], {}, INTERACTIVE, no)
    assert reason is not None and "denied" in reason
    assert len(no.asked) == 1


async def test_admin_in_an_interactive_run_without_approver_is_denied(tools: dict[str, Tool]) -> None:
    reason = await authorize(tools["restart_service"], {}, INTERACTIVE, None)
    assert reason is not None and "no approver" in reason
