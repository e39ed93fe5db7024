"""Load user-declared CLI tools from YAML (``security.cli_tools_file``).

The file is checked completely at startup, so a mistake stops the daemon with a
message naming the tool and the field instead of surfacing in a chat later::

    tools:
      - name: grep_logs
        description: Search the application logs.
        category: read                     # read | write | admin (default admin)
        cmd: grep                          # a program, looked up on PATH at load
        args: ["-n", "--", "{{pattern}}", "/var/log/app.log"]
        optional_args: {max: ["-m", "{{max}}"]}
        parameters:
          pattern: {type: string, maxLength: 200, description: Text to find}
          max: {type: integer, optional: true}
        env: {LC_ALL: C, API_TOKEN: "${APP_TOKEN}"}   # ${VAR}: from botd's environment at load
        timeout_s: 30

Every ``{{var}}`` must name a declared parameter; optional parameters may only
appear under ``optional_args`` (whose arguments are added when the value is given,
or is true for a boolean). There is no escape for a literal ``{{``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from agent.tools.cli_tool import TEMPLATE, CliTool, CliToolSpec, Parameter, program_path
from agent.tools.environment import expand_env_refs
from agent.types import Category

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENUM_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


class ToolConfigError(ValueError):
    """The CLI tools file is invalid; the message names the file, the tool and the field."""


class _ParameterModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["string", "integer", "number", "boolean"] = "string"
    description: str = ""
    enum: list[StrictBool | StrictInt | StrictFloat | StrictStr] | None = Field(default=None, min_length=1)
    pattern: str | None = None
    maxLength: int | None = Field(default=None, ge=1)  # the JSON Schema spelling
    optional: bool = False


class _ToolModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    category: Literal["read", "write", "admin"] = "admin"
    cmd: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    optional_args: dict[str, list[str]] = Field(default_factory=dict)
    parameters: dict[str, _ParameterModel] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: float | None = Field(default=None, gt=0)


class _Problem(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def load_cli_tools(
    path: Path, reserved: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> list[CliTool]:
    """Read and check every tool in ``path``; raises ``ToolConfigError`` on the first problem."""
    environ = os.environ if environ is None else environ
    try:
        text = path.expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolConfigError(f"{path}: cannot read the CLI tools file: {exc}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ToolConfigError(f"{path}: invalid YAML: {_yaml_problem(exc)}") from None
    if document is None:
        return []
    if not isinstance(document, dict) or set(document) - {"tools"}:
        raise ToolConfigError(f"{path}: expected a mapping with one key, 'tools' (a list of tools)")
    entries = document.get("tools") or []
    if not isinstance(entries, list):
        raise ToolConfigError(f"{path}: field 'tools' must be a list of tools")
    taken = set(reserved)
    tools: list[CliTool] = []
    for index, entry in enumerate(entries):
        label = (
            repr(entry["name"])
            if isinstance(entry, dict) and isinstance(entry.get("name"), str)
            else f"#{index + 1}"
        )
        try:
            spec = _build(entry, environ)
            if spec.name in reserved:
                raise _Problem("name", f"{spec.name!r} is the name of a built-in tool")
            if spec.name in taken:
                raise _Problem("name", f"another tool is already named {spec.name!r}")
        except _Problem as problem:
            raise ToolConfigError(f"{path}: tool {label}: field '{problem.field}': {problem}") from None
        taken.add(spec.name)
        tools.append(CliTool(spec))
    return tools


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's complaint and position, without echoing file content (it may hold secrets)."""
    problem = getattr(exc, "problem", None) or type(exc).__name__
    mark = getattr(exc, "problem_mark", None)
    return (
        f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(problem)
    )


def _build(entry: Any, environ: Mapping[str, str]) -> CliToolSpec:
    if not isinstance(entry, dict):
        raise _Problem("(tool)", "each tool must be a mapping")
    try:
        model = _ToolModel.model_validate(entry)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = _location(error["loc"])
        message = {"missing": "is required", "extra_forbidden": "is not a known field"}.get(
            error["type"], error["msg"]
        )
        raise _Problem(where, message) from None
    parameters = {name: _parameter(name, p) for name, p in model.parameters.items()}
    used: set[str] = set()
    for i, template in enumerate(model.args):
        for var in _template_vars(f"args[{i}]", template, parameters):
            if parameters[var].optional:
                raise _Problem(f"args[{i}]", f"parameter {var!r} is optional; put it under optional_args")
            used.add(var)
    for key, templates in model.optional_args.items():
        if key not in parameters:
            raise _Problem(f"optional_args.{key}", f"{key!r} is not a declared parameter")
        if not parameters[key].optional:
            raise _Problem(f"optional_args.{key}", f"parameter {key!r} is not optional (add optional: true)")
        used.add(key)
        for i, template in enumerate(templates):
            for var in _template_vars(f"optional_args.{key}[{i}]", template, parameters):
                if var != key and parameters[var].optional:
                    raise _Problem(f"optional_args.{key}[{i}]", f"{var!r} is optional and may be absent here")
    for name in parameters:
        if name not in used:
            raise _Problem(f"parameters.{name}", "this parameter is not used in args or optional_args")
    program = _program(model.cmd, environ)
    return CliToolSpec(
        name=model.name,
        description=model.description or f"Run {model.cmd}.",
        category=_category(model.category),
        program=str(program),
        args=tuple(model.args),
        optional_args={k: tuple(v) for k, v in model.optional_args.items()},
        parameters=parameters,
        env={key: _env_value(key, value, environ) for key, value in model.env.items()},
        timeout_s=model.timeout_s,
    )


def _category(value: str) -> Category:
    if value == "read":
        return "read"
    return "write" if value == "write" else "admin"


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(tool)"


def _parameter(name: str, model: _ParameterModel) -> Parameter:
    where = f"parameters.{name}"
    if not _IDENTIFIER.fullmatch(name):
        raise _Problem(where, "parameter names must be letters, digits and '_' (not starting with a digit)")
    if model.type != "string" and (model.pattern is not None or model.maxLength is not None):
        raise _Problem(where, "pattern and maxLength apply to string parameters only")
    if model.pattern is not None:
        try:
            re.compile(model.pattern)
        except re.error as exc:
            raise _Problem(f"{where}.pattern", f"invalid regular expression: {exc}") from None
    if model.enum is not None:
        for value in model.enum:
            wrong_bool = isinstance(value, bool) and model.type != "boolean"
            if wrong_bool or not isinstance(value, _ENUM_TYPES[model.type]):
                raise _Problem(f"{where}.enum", f"{value!r} is not of type {model.type}")
    return Parameter(
        type=model.type,
        description=model.description,
        enum=tuple(model.enum) if model.enum is not None else None,
        pattern=model.pattern,
        max_length=model.maxLength,
        optional=model.optional,
    )


def _template_vars(where: str, template: str, parameters: Mapping[str, Parameter]) -> list[str]:
    names = TEMPLATE.findall(template)
    leftover = TEMPLATE.sub("", template)
    if "{{" in leftover or "}}" in leftover:
        raise _Problem(where, f"malformed template in {template!r} (use {{{{name}}}} with a parameter name)")
    for var in names:
        if var not in parameters:
            raise _Problem(where, f"template {{{{{var}}}}} names an undeclared parameter")
    return names


def _program(cmd: str, environ: Mapping[str, str]) -> Path:
    found = program_path(cmd, environ.get("PATH", os.defpath))
    if found is None:
        raise _Problem("cmd", f"program {cmd!r} was not found or is not executable")
    return found


def _env_value(key: str, value: str, environ: Mapping[str, str]) -> str:
    if not _IDENTIFIER.fullmatch(key):
        raise _Problem(f"env.{key}", "not a valid environment variable name")
    try:
        return expand_env_refs(value, environ)
    except ValueError as exc:
        raise _Problem(f"env.{key}", str(exc)) from None
