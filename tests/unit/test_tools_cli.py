"""CLI tools declared in YAML: loading, validation errors, argv building and real execution."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from agent.tools.builtin import BUILTIN_TOOL_NAMES, load_tools
from agent.tools.cli_tool import CliTool
from agent.tools.cli_tools import ToolConfigError, load_cli_tools
from agent.tools.registry import ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSettings

PRINTF = shutil.which("printf") or "/usr/bin/printf"

TOOLS_YAML = f"""
tools:
  - name: echo_args
    description: Print each argument on its own line.
    category: read
    cmd: {PRINTF}
    args: ["%s\\n", "{{{{text}}}}", "prefix-{{{{text}}}}-suffix"]
    optional_args:
      count: ["--count={{{{count}}}}"]
      loud: ["LOUD"]
    parameters:
      text: {{type: string, maxLength: 200, description: Text to print}}
      count: {{type: integer, optional: true}}
      loud: {{type: boolean, optional: true}}
  - name: git_log
    description: Show the log of a branch.
    category: read
    cmd: {PRINTF}
    args: ["%s\\n", "{{{{branch}}}}", "{{{{format}}}}"]
    parameters:
      branch: {{type: string, pattern: "[A-Za-z0-9._/-]+", maxLength: 100}}
      format: {{type: string, enum: [oneline, short, full]}}
  - name: show_env
    description: Print the environment.
    category: admin
    cmd: env
    env: {{TOOL_TOKEN: "${{BOTD_TEST_TOOL_TOKEN}}", TOOL_MODE: literal-value}}
    timeout_s: 5
"""


@pytest.fixture
def settings(tmp_path: Path) -> ToolSettings:
    return ToolSettings(workspace=tmp_path / "workspace", timeout_s=20, max_output_bytes=4096)


@pytest.fixture
def ctx(settings: ToolSettings) -> ToolContext:
    return ToolContext(run_id="r", session_key="s", settings=settings)


@pytest.fixture
def tools_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BOTD_TEST_TOOL_TOKEN", "tok-from-daemon-env")
    path = tmp_path / "tools.yaml"
    path.write_text(TOOLS_YAML)
    return path


@pytest.fixture
def registry(settings: ToolSettings, tools_file: Path) -> ToolRegistry:
    return ToolRegistry(load_tools(settings, tools_file))


async def call(registry: ToolRegistry, ctx: ToolContext, name: str, raw: str) -> ToolOutput:
    """What the agent loop does with a call: validate, execute, turn ToolError into an error result."""
    try:
        args = registry.parse_arguments(name, raw)
        tool = registry.get(name)
        assert tool is not None
        return await tool.execute(args, ctx)
    except ToolError as exc:
        return ToolOutput(str(exc), is_error=True)


def test_yaml_tools_are_registered_after_the_builtins(registry: ToolRegistry) -> None:
    assert registry.names() == [*BUILTIN_TOOL_NAMES, "echo_args", "git_log", "show_env"]
    schema = next(s for s in registry.schemas() if s["function"]["name"] == "git_log")["function"]
    assert schema["description"] == "Show the log of a branch."
    assert schema["parameters"]["required"] == ["branch", "format"]
    assert schema["parameters"]["properties"]["branch"]["pattern"] == "^(?:[A-Za-z0-9._/-]+)$"
    assert schema["parameters"]["properties"]["format"]["enum"] == ["oneline", "short", "full"]
    assert schema["parameters"]["additionalProperties"] is False
    tool = registry.get("show_env")
    assert tool is not None and tool.category == "admin"


async def test_yaml_tool_is_callable(registry: ToolRegistry, ctx: ToolContext) -> None:
    out = await call(registry, ctx, "echo_args", '{"text": "hello world", "count": 3, "loud": true}')
    assert not out.is_error, out.content
    assert out.content.splitlines()[:4] == ["hello world", "prefix-hello world-suffix", "--count=3", "LOUD"]
    quiet = await call(registry, ctx, "echo_args", '{"text": "x", "loud": false}')
    assert quiet.content.splitlines()[:3] == ["x", "prefix-x-suffix", "[exit code: 0]"]


async def test_shell_metacharacters_stay_literal(
    registry: ToolRegistry, ctx: ToolContext, tmp_path: Path
) -> None:
    pwned = tmp_path / "pwned"
    for text in [
        f"; touch {pwned}",
        f"$(touch {pwned})",
        f"`touch {pwned}`",
        f"a && touch {pwned}",
        f"| touch {pwned}",
    ]:
        out = await call(registry, ctx, "echo_args", f'{{"text": "{text}"}}')
        assert not out.is_error, out.content
        assert out.content.splitlines()[0] == text
        assert not pwned.exists()


def test_each_template_fills_exactly_one_argv_element(registry: ToolRegistry) -> None:
    tool = registry.get("echo_args")
    assert isinstance(tool, CliTool)
    argv = tool.argv({"text": "a b\tc\n'd' \"e\"", "count": 2})
    assert argv == [PRINTF, "%s\n", "a b\tc\n'd' \"e\"", "prefix-a b\tc\n'd' \"e\"-suffix", "--count=2"]


@pytest.mark.parametrize(
    "raw",
    [
        '{"branch": "main; rm -rf /", "format": "oneline"}',
        '{"branch": "$(id)", "format": "oneline"}',
        '{"branch": "main\\n--output=/tmp/x", "format": "oneline"}',
        '{"branch": "main", "format": "oneline --output=/tmp/x"}',
        '{"branch": "main", "format": "ONELINE"}',
        '{"branch": "main"}',
        '{"branch": "main", "format": "oneline", "extra": "x"}',
        '{"branch": 7, "format": "oneline"}',
    ],
)
async def test_injection_against_enum_or_pattern_is_rejected(
    registry: ToolRegistry, ctx: ToolContext, raw: str
) -> None:
    out = await call(registry, ctx, "git_log", raw)
    assert out.is_error
    assert out.content.startswith("Error:")


def test_execution_revalidates_even_without_the_registry(registry: ToolRegistry) -> None:
    tool = registry.get("git_log")
    assert isinstance(tool, CliTool)
    with pytest.raises(ToolError, match="does not match the pattern"):
        tool.argv({"branch": "main\n", "format": "short"})  # `$` in JSON Schema would let a newline through
    with pytest.raises(ToolError, match="must be one of"):
        tool.argv({"branch": "main", "format": "medium"})
    echo = registry.get("echo_args")
    assert isinstance(echo, CliTool)
    with pytest.raises(ToolError, match="may not start with '-'"):
        echo.argv({"text": "--output=/etc/passwd"})
    with pytest.raises(ToolError, match="NUL"):
        echo.argv({"text": "a\x00b"})
    with pytest.raises(ToolError, match="must be an integer"):
        echo.argv({"text": "a", "count": 1.5})


async def test_declared_env_reaches_the_subprocess_and_secrets_do_not(
    registry: ToolRegistry, ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-visible")
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "tg-never-visible")
    out = await call(registry, ctx, "show_env", "{}")
    assert not out.is_error, out.content
    lines = out.content.splitlines()
    assert "TOOL_TOKEN=tok-from-daemon-env" in lines
    assert "TOOL_MODE=literal-value" in lines
    assert "never-visible" not in out.content
    assert "BOTD_TEST_TOOL_TOKEN" not in out.content


async def test_failing_cli_tool_reports_exit_code_and_stderr(tmp_path: Path, ctx: ToolContext) -> None:
    path = tmp_path / "fail.yaml"
    path.write_text(
        f"tools:\n  - name: fails\n    category: read\n    cmd: {sys.executable}\n"
        "    args: ['-c', 'import sys; print(\"to stderr\", file=sys.stderr); sys.exit(4)']\n"
    )
    (tool,) = load_cli_tools(path)
    out = await tool.execute({}, ctx)
    assert out.is_error
    assert "[stderr]\nto stderr" in out.content and "[exit code: 4]" in out.content


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tools.yaml"
    path.write_text(text)
    return path


INVALID = [
    ("tools: [\n  - name: x\n", None, "invalid YAML"),
    ("- just a list\n", None, "'tools'"),
    ("tools: {name: x}\n", None, "field 'tools' must be a list"),
    ("tools:\n  - name: t1\n    cmd: env\n    colour: red\n", "'t1'", "field 'colour': is not a known field"),
    ("tools:\n  - name: t2\n    description: no command\n", "'t2'", "field 'cmd': is required"),
    ("tools:\n  - cmd: env\n", "#1", "field 'name': is required"),
    ("tools:\n  - name: 'bad name!'\n    cmd: env\n", "'bad name!'", "field 'name'"),
    (
        "tools:\n  - name: t3\n    cmd: env\n    args: ['{{who}}']\n",
        "'t3'",
        "field 'args[0]': template {{who}} names an undeclared parameter",
    ),
    (
        "tools:\n  - name: t4\n    cmd: env\n    args: ['{{x}}']\n    parameters: {x: {pattern: '([a-z'}}\n",
        "'t4'",
        "field 'parameters.x.pattern': invalid regular expression",
    ),
    (
        "tools:\n  - name: t5\n    cmd: env\n  - name: t5\n    cmd: env\n",
        "'t5'",
        "field 'name': another tool is already named 't5'",
    ),
    (
        "tools:\n  - name: bash\n    cmd: env\n",
        "'bash'",
        "field 'name': 'bash' is the name of a built-in tool",
    ),
    (
        "tools:\n  - name: t6\n    cmd: env\n    env: {TOKEN: '${BOTD_TEST_SURELY_UNSET_VAR}'}\n",
        "'t6'",
        "field 'env.TOKEN': environment variable BOTD_TEST_SURELY_UNSET_VAR is not set",
    ),
    (
        "tools:\n  - name: t7\n    cmd: no-such-program-xyz\n",
        "'t7'",
        "field 'cmd': program 'no-such-program-xyz'",
    ),
    (
        "tools:\n  - name: t8\n    cmd: env\n    args: ['{{x}}']\n    parameters: {x: {type: float}}\n",
        "'t8'",
        "field 'parameters.x.type'",
    ),
    (
        "tools:\n  - name: t9\n    cmd: env\n    args: ['{{x}}']\n    parameters: {x: {optional: true}}\n",
        "'t9'",
        "field 'args[0]': parameter 'x' is optional; put it under optional_args",
    ),
    (
        "tools:\n  - name: t10\n    cmd: env\n    parameters: {x: {type: string}}\n",
        "'t10'",
        "field 'parameters.x': this parameter is not used",
    ),
    (
        "tools:\n  - name: t11\n    cmd: env\n    args: ['{{x}']\n    parameters: {x: {}}\n",
        "'t11'",
        "field 'args[0]': malformed template",
    ),
    (
        "tools:\n  - name: t12\n    cmd: env\n    args: ['{{x}}']\n    parameters: {x: {type: integer, enum: [a]}}\n",
        "'t12'",
        "field 'parameters.x.enum': 'a' is not of type integer",
    ),
    (
        "tools:\n  - name: t13\n    cmd: env\n    optional_args: {y: ['{{y}}']}\n",
        "'t13'",
        "field 'optional_args.y': 'y' is not a declared parameter",
    ),
    ("tools:\n  - name: t14\n    cmd: env\n    category: root\n", "'t14'", "field 'category'"),
    ("tools:\n  - name: t15\n    cmd: env\n    timeout_s: 0\n", "'t15'", "field 'timeout_s'"),
]


@pytest.mark.parametrize(("text", "tool", "message"), INVALID)
def test_invalid_files_name_the_tool_and_the_field(
    tmp_path: Path, settings: ToolSettings, text: str, tool: str | None, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ToolConfigError) as info:
        load_tools(settings, path)
    error = str(info.value)
    assert error.startswith(str(path))
    if tool is not None:
        assert f"tool {tool}:" in error
    assert message in error


def test_missing_file_is_a_config_error(tmp_path: Path, settings: ToolSettings) -> None:
    with pytest.raises(ToolConfigError, match="cannot read"):
        load_tools(settings, tmp_path / "absent.yaml")


def test_yaml_error_does_not_echo_file_content(tmp_path: Path) -> None:
    path = write(tmp_path, "tools:\n  - name: x\n    env: {TOKEN: sk-literal-secret-value\n")
    with pytest.raises(ToolConfigError) as info:
        load_cli_tools(path)
    assert "line" in str(info.value)
    assert "sk-literal-secret-value" not in str(info.value)


def test_empty_file_declares_no_tools(tmp_path: Path, settings: ToolSettings) -> None:
    assert load_cli_tools(write(tmp_path, "")) == []
    assert [t.name for t in load_tools(settings, None)] == list(BUILTIN_TOOL_NAMES)
