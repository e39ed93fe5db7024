"""ToolRegistry.parse_arguments under hostile arguments: only ToolError, and what passes conforms.

The registry holds the built-in tools, the cron tool and CLI tools loaded from a YAML file
(enum, pattern, maxLength, integer, number, boolean, optional). Arguments are random
strings, random JSON, and valid arguments with fields dropped, retyped or added. The
conformance check below is written independently of jsonschema, with JSON Schema's
meaning: numbers are finite, ``pattern`` is an ECMA-262 search (``$`` ends the value),
``maxLength`` counts code points, ``integer`` accepts 1.0 but not true.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.tools.builtin import builtin_tools
from agent.tools.cli_tool import CliTool
from agent.tools.cli_tools import load_cli_tools
from agent.tools.registry import ToolError, ToolRegistry, ToolSettings
from scheduler.cron_tool import CronTool
from tests.fuzz.strategies import json_values, mutate

CLI_TOOLS = """
tools:
  - name: deploy
    description: Deploy a ref.
    category: admin
    cmd: echo
    args: ["deploy", "{{mode}}", "--ref={{ref}}", "{{target}}"]
    optional_args:
      count: ["-n", "{{count}}"]
      ratio: ["--ratio", "{{ratio}}"]
      force: ["--force"]
      note: ["--note", "{{note}}"]
      level: ["--level={{level}}"]
    parameters:
      mode: {type: string, enum: [fast, slow, "with space", "-dash"]}
      ref: {type: string, pattern: "[A-Za-z0-9._/-]+", maxLength: 40}
      target: {type: string, maxLength: 12}
      count: {type: integer, optional: true}
      ratio: {type: number, optional: true}
      force: {type: boolean, optional: true}
      note: {type: string, maxLength: 10, optional: true}
      level: {type: integer, enum: [1, 2, 3], optional: true}
  - name: lookup
    description: Look a word up.
    category: read
    cmd: echo
    args: ["{{word}}"]
    parameters:
      word: {type: string, pattern: "[a-z]+(-[a-z]+)*"}
"""


def _fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> ToolRegistry:
    path = tmp_path_factory.mktemp("cli") / "tools.yaml"
    path.write_text(CLI_TOOLS, encoding="utf-8")
    tools = [
        *builtin_tools(ToolSettings(workspace=path.parent / "workspace")),
        CronTool(store=None),  # type: ignore[arg-type]  # only its schema is used here
    ]
    tools.extend(load_cli_tools(path, reserved=[t.name for t in tools]))
    return ToolRegistry(tools)


# -- an independent conformance check -----------------------------------------------------------


def _ecma_search(pattern: str, value: str) -> bool:
    # The patterns used here anchor with ^…$ and contain no "$" elsewhere.
    assert pattern.count("$") <= 1 and (not pattern.count("$") or pattern.endswith("$"))
    return re.search(pattern.removesuffix("$") + r"\Z" if pattern.endswith("$") else pattern, value) is not None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def conforms(schema: dict[str, Any], value: Any) -> bool:
    """Whether ``value`` satisfies ``schema`` (the keywords our tools use)."""
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return False
        props = schema.get("properties", {})
        if any(key not in value for key in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and set(value) - set(props):
            return False
        return all(conforms(props[k], v) for k, v in value.items() if k in props)
    if kind == "array":
        if not isinstance(value, list):
            return False
        if schema.get("uniqueItems") and len({json.dumps(v, sort_keys=True) for v in value}) != len(value):
            return False
        return all(conforms(schema.get("items", {}), v) for v in value)
    if kind == "string":
        if not isinstance(value, str):
            return False
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return False
        if "minLength" in schema and len(value) < schema["minLength"]:
            return False
        if "pattern" in schema and not _ecma_search(schema["pattern"], value):
            return False
    elif kind == "boolean":
        if not isinstance(value, bool):
            return False
    elif kind in ("integer", "number"):
        if not _is_number(value) or not math.isfinite(value):
            return False
        if kind == "integer" and not float(value).is_integer():
            return False
        if "minimum" in schema and value < schema["minimum"]:
            return False
        if "maximum" in schema and value > schema["maximum"]:
            return False
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            return False
    if "enum" in schema:
        return any((type(value) is type(e) and value == e) or (_is_number(value) and _is_number(e) and value == e)
                   for e in schema["enum"])
    return True


# -- argument generators ------------------------------------------------------------------------

_STRING_PIECES = ["a", "Z", "0", "-", "_", ".", "/", " ", "\n", "\x00", "😀", "é", "$", "^", "..", "--x", "ש"]


@st.composite
def value_for(draw: st.DrawFn, schema: dict[str, Any]) -> Any:
    """A value meant to satisfy ``schema``, or to miss it just barely."""
    if "enum" in schema and draw(st.integers(0, 3)):
        return draw(st.sampled_from(schema["enum"]))
    kind = schema.get("type")
    if kind == "string":
        if "pattern" in schema and draw(st.booleans()):
            text = draw(st.from_regex(schema["pattern"]))
        else:
            text = draw(st.lists(st.sampled_from(_STRING_PIECES), max_size=15).map("".join) | st.text(max_size=50))
        if "maxLength" in schema and draw(st.booleans()):
            text = text[: schema["maxLength"] + draw(st.integers(-1, 1))]
        return text
    if kind == "integer":
        return draw(st.integers(-5, 10**6) | st.sampled_from([0, 1, -1, 2**63, 1.0, 2.5]))
    if kind == "number":
        return draw(st.floats(allow_nan=False, allow_infinity=False) | st.integers(-5, 500) | st.just(0))
    if kind == "boolean":
        return draw(st.booleans() | st.sampled_from([0, 1, "true"]))
    if kind == "array":
        return draw(st.lists(value_for(schema.get("items", {})), max_size=3))
    return draw(json_values)


@st.composite
def arguments_for(draw: st.DrawFn, schema: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    args = {}
    for key, sub in props.items():
        if key in required or draw(st.booleans()):
            args[key] = draw(value_for(sub))
    return args


# Hand-made strings that have broken JSON decoders and validators before.
_NASTY = [
    "", " ", "null", "[]", "{}", '""', "0", "NaN", "-Infinity", '{"command": NaN}', '{"timeout_s": Infinity}',
    '{"command": "ls", "timeout_s": 1e999}', '{"command": "ls", "timeout_s": -0.0}', '{"path": "a", "offset": 1.0}',
    '{"path": "a", "offset": ' + "9" * 5000 + "}", '{"path": "a", "offset": 1e-400}',
    '{"command": "ls", "command": 5}', '\ufeff{"command": "ls"}', '{"command": "\\ud800"}', '{"command": "a\\u0000b"}',
    "[" * 5000, '{"a":' * 3000, '{"command": ' + "[" * 995 + "]" * 995 + "}",
    '{"action": "add", "id": "job\\n"}', '{"word": "abc\\n"}', '{"word": "abc\\n\\n"}',
    '{"mode": "fast", "ref": "main\\n", "target": "t"}', '{"mode": "fast", "ref": "main", "target": "t", "ratio": NaN}',
    '{"mode": "fast", "ref": "main", "target": "t", "count": true}', '{"mode": 1, "ref": [], "target": {}}',
]


def _check(registry: ToolRegistry, name: str, raw: str) -> None:
    try:
        args = registry.parse_arguments(name, raw)
    except ToolError as exc:
        assert str(exc).startswith("Error: ")
        return
    tool = registry.get(name)
    assert tool is not None
    assert isinstance(args, dict)
    assert conforms(tool.parameters, args), (name, raw, args)
    if isinstance(tool, CliTool):
        try:  # the tool's own checks may refuse more (NUL bytes, a leading "-"), but only with ToolError
            argv = tool.argv(args)
        except ToolError:
            return
        assert all(isinstance(a, str) and "\x00" not in a for a in argv)


# -- the properties -----------------------------------------------------------------------------


@pytest.mark.parametrize("raw", _NASTY)
def test_hand_made_nasty_arguments(registry: ToolRegistry, raw: str) -> None:
    for name in registry.names():
        _check(registry, name, raw)


def test_nesting_near_the_decoder_limit_from_a_deep_stack(registry: ToolRegistry) -> None:
    """The agent calls parse_arguments some frames down; nesting must still give a ToolError."""
    limit = sys.getrecursionlimit()

    def nested(frames: int, raw: str) -> None:
        if frames:
            nested(frames - 1, raw)
        else:
            _check(registry, "bash", raw)

    for depth in (limit - 200, limit - 50, limit - 5, limit + 5):
        for raw in ('{"command": ' + "[" * depth + "]" * depth + "}", '{"command": "x", "z": ' + '{"a":' * depth + "1" + "}" * depth + "}"):
            for frames in (0, 100, 300):
                nested(frames, raw)


@_fuzz(300)
@given(data=st.data())
def test_random_strings_and_json_give_only_tool_errors(registry: ToolRegistry, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from([*registry.names(), "nope", ""]))
    raw = data.draw(
        st.text(max_size=200)
        | json_values.map(json.dumps)
        | st.dictionaries(st.sampled_from(["command", "path", "content", "id", "mode", "ref", "x"]), json_values,
                          max_size=4).map(json.dumps)
    )
    if name not in registry.names():
        with pytest.raises(ToolError, match="unknown tool"):
            registry.parse_arguments(name, raw)
        return
    _check(registry, name, raw)


@_fuzz(700)
@given(data=st.data())
def test_near_valid_arguments_conform_or_are_refused(registry: ToolRegistry, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(registry.names()))
    tool = registry.get(name)
    assert tool is not None
    args = data.draw(arguments_for(tool.parameters))
    if data.draw(st.booleans()):
        args = mutate(args, data.draw, keys=st.sampled_from([*tool.parameters.get("properties", {}), "extra"]))
    raw = json.dumps(args, ensure_ascii=data.draw(st.booleans()))
    _check(registry, name, raw)
    # Nothing valid is refused.
    if conforms(tool.parameters, args):
        assert registry.parse_arguments(name, raw) == args


@_fuzz(200)
@given(data=st.data())
def test_cli_values_that_pass_are_what_the_yaml_declares(registry: ToolRegistry, data: st.DataObject) -> None:
    tool = registry.get("deploy")
    assert isinstance(tool, CliTool)
    args = data.draw(arguments_for(tool.parameters))
    try:
        parsed = registry.parse_arguments("deploy", json.dumps(args))
    except ToolError:
        return
    spec = tool.spec.parameters
    assert parsed["mode"] in spec["mode"].enum  # type: ignore[operator]
    assert re.fullmatch(spec["ref"].pattern or "", parsed["ref"]) and len(parsed["ref"]) <= 40
    assert len(parsed["target"]) <= 12
    if "note" in parsed:
        assert isinstance(parsed["note"], str) and len(parsed["note"]) <= 10
    if "level" in parsed:
        assert parsed["level"] in (1, 2, 3) and not isinstance(parsed["level"], bool)
    for key in ("count", "ratio"):
        if key in parsed:
            assert _is_number(parsed[key]) and math.isfinite(parsed[key])
