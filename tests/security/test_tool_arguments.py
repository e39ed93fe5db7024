"""Arguments that try to become options, and shell lines that hide the program they run."""

from __future__ import annotations

import pytest

from agent.tools.cli_tool import CliTool, CliToolSpec, Parameter
from agent.tools.command_guard import check_command
from agent.tools.command_rules import BlockedCommandError
from agent.tools.registry import ToolError


def tool(*args: str) -> CliTool:
    spec = CliToolSpec(
        name="logs", description="d", category="read", program="/bin/echo", args=args,
        parameters={"name": Parameter(pattern=r"[-=/\w.]+"), "level": Parameter(type="integer")},
    )
    return CliTool(spec)


@pytest.mark.parametrize("template", ["{{name}}.log", "{{name}}", "{{ name }}-suffix"])
def test_a_value_opening_an_element_cannot_start_with_a_dash(template: str) -> None:
    with pytest.raises(ToolError, match="may not start with '-'"):
        tool(template, "{{level}}").argv({"name": "--output=/elsewhere", "level": 1})


def test_a_negative_number_opening_an_element_is_refused_too() -> None:
    with pytest.raises(ToolError, match="may not start with '-'"):
        tool("{{name}}", "{{level}}").argv({"name": "app", "level": -5})


def test_a_template_that_starts_with_a_dash_takes_any_value() -> None:
    argv = tool("--name={{name}}", "--level={{level}}", "prefix-{{name}}").argv({"name": "-x", "level": -5})
    assert argv[1:] == ["--name=-x", "--level=-5", "prefix--x"]


@pytest.mark.parametrize(
    "command",
    [
        "source <(echo rm -rf ~)",
        ". <(printf 'rm -rf ~')",
        "bash <(echo 'rm -rf ~')",
        "sh < <(echo 'rm -rf ~')",
        "python3 <(echo 'import shutil')",
    ],
)
def test_a_shell_fed_by_process_substitution_is_refused(command: str) -> None:
    with pytest.raises(BlockedCommandError, match="process substitution"):
        check_command(command)


@pytest.mark.parametrize("command", ["diff <(sort a) <(sort b)", "cat <(echo hi)", "echo '<(x)'"])
def test_process_substitution_feeding_ordinary_programs_still_runs(command: str) -> None:
    check_command(command)
