"""A user-declared command-line program offered to the model as a tool.

The program runs without a shell (``shell=False``): the argv is the program
followed by the declared ``args``, where each ``{{var}}`` template is replaced by
the argument's value *inside one argv element*. A value is never split and never
interpreted, so ``; touch x`` stays the literal text of one argument. Values are
validated against the generated JSON schema by the registry, and again here
(type, enum, full-match pattern, length, NUL bytes) before anything runs. A value
that would make an argv element start with ``-`` is refused unless that template
itself starts with ``-`` (``{{name}}.log`` fed ``--output=/x`` is refused;
``--name={{name}}`` is fine), so a value can never turn into an option.
"""

from __future__ import annotations

import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agent.tools.environment import subprocess_env
from agent.tools.process import run_sandboxed
from agent.tools.registry import Tool, ToolContext, ToolError, ToolOutput
from agent.types import Category

TEMPLATE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
MAX_ARGUMENT_BYTES = 131_072  # Linux MAX_ARG_STRLEN

ParamType = Literal["string", "integer", "number", "boolean"]


@dataclass(frozen=True)
class Parameter:
    """One declared parameter of a CLI tool."""

    type: ParamType = "string"
    description: str = ""
    enum: tuple[str | int | float | bool, ...] | None = None
    pattern: str | None = None
    max_length: int | None = None
    optional: bool = False

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.description:
            out["description"] = self.description
        if self.enum is not None:
            out["enum"] = list(self.enum)
        if self.pattern is not None:
            out["pattern"] = f"^(?:{self.pattern})$"  # JSON Schema searches; the tool means the whole value
        if self.max_length is not None:
            out["maxLength"] = self.max_length
        return out


@dataclass(frozen=True)
class CliToolSpec:
    """A validated tool declaration, ready to run (``program`` is an absolute path)."""

    name: str
    description: str
    category: Category
    program: str
    args: tuple[str, ...] = ()
    optional_args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    parameters: dict[str, Parameter] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None


class CliTool(Tool):
    """Runs ``spec.program`` with the templated arguments; exit code and stderr go to the model."""

    def __init__(self, spec: CliToolSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.description = spec.description
        self.category = spec.category
        self.parameters = {
            "type": "object",
            "properties": {name: p.schema() for name, p in spec.parameters.items()},
            "required": [name for name, p in spec.parameters.items() if not p.optional],
            "additionalProperties": False,
        }
        templates = [*spec.args, *(t for group in spec.optional_args.values() for t in group)]
        # Variables that open an argv element: their values decide whether it reads as an option.
        self._leading = {m.group(1) for t in templates if (m := TEMPLATE.match(t))}

    def argv(self, args: dict[str, Any]) -> list[str]:
        """The argv for validated ``args``; raises ``ToolError`` when a value is not acceptable."""
        values = self._validate(args)
        argv = [self.spec.program, *(_fill(t, values) for t in self.spec.args)]
        for name, templates in self.spec.optional_args.items():
            value = args.get(name)
            if value is None or value is False:
                continue
            argv.extend(_fill(t, values) for t in templates)
        return argv

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        argv = self.argv(args)
        settings = ctx.settings
        try:
            result = await run_sandboxed(
                argv,
                settings=settings,
                env=subprocess_env(settings.env_allowlist, self.spec.env),
                timeout_s=self.spec.timeout_s or settings.timeout_s,
            )
        except OSError as exc:
            raise ToolError(f"Error: could not start {self.spec.program}: {exc.strerror or exc}.") from None
        return ToolOutput(result.render(), is_error=not result.ok)

    def _validate(self, args: dict[str, Any]) -> dict[str, str]:
        unknown = sorted(set(args) - set(self.spec.parameters))
        if unknown:
            raise ToolError(f"Error: {self.name!r} has no parameter {unknown[0]!r}.")
        values: dict[str, str] = {}
        for name, param in self.spec.parameters.items():
            if args.get(name) is None:
                if not param.optional:
                    raise ToolError(f"Error: {self.name!r} needs the parameter {name!r}.")
                continue
            values[name] = self._check_value(name, param, args[name])
        return values

    def _check_value(self, name: str, param: Parameter, value: Any) -> str:
        text = _as_text(name, param.type, value)
        if param.enum is not None and value not in param.enum:
            allowed = ", ".join(repr(v) for v in param.enum)
            raise ToolError(f"Error: {name!r} must be one of {allowed}.")
        if param.pattern is not None and not re.fullmatch(param.pattern, text):
            raise ToolError(f"Error: {name!r} does not match the pattern {param.pattern!r}.")
        if param.max_length is not None and len(text) > param.max_length:
            raise ToolError(f"Error: {name!r} is longer than {param.max_length} characters.")
        if "\x00" in text:
            raise ToolError(f"Error: {name!r} contains a NUL byte.")
        if len(text.encode("utf-8", errors="surrogatepass")) > MAX_ARGUMENT_BYTES:
            raise ToolError(f"Error: {name!r} is longer than {MAX_ARGUMENT_BYTES} bytes.")
        if text.startswith("-") and name in self._leading:
            raise ToolError(f"Error: {name!r} may not start with '-' (it would be read as an option).")
        return text


def _as_text(name: str, kind: ParamType, value: Any) -> str:
    """The argv text of a value, after checking its JSON type."""
    if kind == "boolean":
        if not isinstance(value, bool):
            raise ToolError(f"Error: {name!r} must be true or false.")
        return "true" if value else "false"
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ToolError(f"Error: {name!r} must be an integer.")
        if isinstance(value, float) and not value.is_integer():
            raise ToolError(f"Error: {name!r} must be an integer.")
        return str(int(value))
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ToolError(f"Error: {name!r} must be a finite number.")
        return str(value)
    if not isinstance(value, str):
        raise ToolError(f"Error: {name!r} must be a string.")
    return value


def _fill(template: str, values: dict[str, str]) -> str:
    """One argv element: the template with every ``{{var}}`` replaced (never split)."""
    return TEMPLATE.sub(lambda m: values[m.group(1)], template)


def program_path(cmd: str, search_path: str | None) -> Path | None:
    """The executable ``cmd`` names (a path, or a name looked up on ``search_path``)."""
    found = shutil.which(cmd, path=search_path)
    return Path(found).absolute() if found else None
