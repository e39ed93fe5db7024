"""Tool definitions and argument validation.

Arguments are validated with ``jsonschema`` (Draft 2020-12) against the very schema
that is sent to the model, so what the model is told and what is enforced can never
drift apart. A validation failure becomes an ``is_error`` tool result, never an
exception. Two readings are made strict, as JSON Schema means them: numbers must be
finite (``NaN``, ``Infinity`` and ``1e999`` are refused), and ``$`` in a ``pattern``
is the end of the value (ECMA-262), not also the place before a final newline.
"""

from __future__ import annotations

import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError

from agent.tools.sandbox import Sandbox, SandboxCommand
from agent.types import Category, ToolPolicy

if TYPE_CHECKING:
    from agent.tools.paths import PathGuard

# Sends a file to the run's chat: (resolved path, caption) -> what to tell the model.
# Raises ToolError when the file cannot be sent. Given by the daemon; None: no chat to send to.
FileSender = Callable[[Path, str | None], Awaitable[str]]

# Asked before an admin tool runs in an interactive run: (tool name, arguments) -> approved?
ApprovalCallback = Callable[[str, dict[str, Any]], Awaitable[bool]]


@dataclass(frozen=True)
class ToolSettings:
    """The safety limits every tool runs under (built by the daemon from ``security``)."""

    workspace: Path
    allowed_paths: tuple[Path, ...] = ()
    denied_paths: tuple[Path, ...] = ()
    timeout_s: float = 120.0
    max_output_bytes: int = 204_800
    env_allowlist: tuple[str, ...] = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TERM", "SHELL", "TMPDIR", "TZ")
    max_read_bytes: int = 1_048_576
    # Unset: no confinement and no limits (unit tests); the daemon always passes a probed one.
    sandbox: Sandbox = field(default_factory=lambda: Sandbox(bwrap=None, reason="not configured"))
    # Paths the tools may read but never write (the agent's own files at the workspace root).
    readonly_paths: tuple[Path, ...] = ()
    # Paths masked in the sandbox for this session (other sessions' directories).
    masked_paths: tuple[Path, ...] = ()

    @cached_property
    def path_guard(self) -> PathGuard:
        """Built once per settings: a root's symlink form is resolved now, never again per call,
        so a link planted later at a root cannot widen it."""
        from agent.tools.paths import PathGuard

        return PathGuard(self.workspace, self.allowed_paths, self.denied_paths,
                         readable=self.readonly_paths, hidden=self.masked_paths)

    def writable_paths(self) -> tuple[Path, ...]:
        """Where a tool process may write: the workspace and the allowed paths."""
        return (self.workspace, *self.allowed_paths)

    def sandbox_command(self, argv: Sequence[str], env: Mapping[str, str]) -> SandboxCommand:
        """``argv`` confined as every tool process is, started in the workspace: for one-shot
        tools and long-lived ones (MCP stdio servers) alike. Exec ``.argv`` with ``.env`` in
        ``.cwd`` in a new session; SIGKILL its process group to end it; then ``.release()``."""
        return self.sandbox.wrap(
            argv, cwd=self.workspace, env=env, writable=self.writable_paths(),
            readonly=self.readonly_paths, hidden=self.masked_paths,
        )


@dataclass
class ToolContext:
    """Per-run facts a tool may need; ``extra`` carries collaborators (e.g. the cron store)."""

    run_id: str
    session_key: str
    settings: ToolSettings
    policy: ToolPolicy = field(default_factory=ToolPolicy)
    chat: dict[str, str | None] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    send_file: FileSender | None = None


@dataclass
class ToolOutput:
    """A tool's answer to the model."""

    content: str
    is_error: bool = False


class ToolError(Exception):
    """Raised by a tool for an expected failure; its message goes to the model as-is."""


class Tool(ABC):
    """A callable capability offered to the model."""

    name: str
    description: str
    parameters: dict[str, Any]
    category: Category = "read"

    @abstractmethod
    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Run the tool. Cancellation must stop everything the tool started."""

    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def _end_anchored(pattern: str) -> str:
    """``pattern`` with every ``$`` outside a character class made ``\\Z`` (end of the value only)."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if ch == "]":
                in_class = False
        elif ch == "[":
            in_class = True
            out.append(ch)
            i += 1
            # A "]" right after "[" or "[^" is a literal member, not the end of the class.
            if pattern[i : i + 1] == "^":
                out.append("^")
                i += 1
            if pattern[i : i + 1] == "]":
                out.append("]")
                i += 1
            continue
        elif ch == "$":
            ch = "\\Z"
        out.append(ch)
        i += 1
    return "".join(out)


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not re.search(_end_anchored(pattern), instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = validators.extend(Draft202012Validator, {"pattern": _pattern})


def _not_json_number(text: str) -> Any:
    raise ValueError(f"{text} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


class ToolRegistry:
    """The set of tools offered to one run, with their compiled validators."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._validators: dict[str, Any] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        try:
            Draft202012Validator.check_schema(tool.parameters)
        except SchemaError as exc:
            raise ValueError(f"tool {tool.name!r}: invalid parameters schema: {exc.message}") from exc
        self._tools[tool.name] = tool
        self._validators[tool.name] = _Validator(tool.parameters)

    def unregister(self, name: str) -> None:
        """Remove a tool (tools that come and go, such as an MCP server's); unknown names are ignored."""
        self._tools.pop(name, None)
        self._validators.pop(name, None)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def subset(self, names: Iterable[str]) -> ToolRegistry:
        """A registry with only the named tools (unknown names ignored)."""
        return ToolRegistry(self._tools[n] for n in names if n in self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self._tools.values()]

    def __len__(self) -> int:
        return len(self._tools)

    def parse_arguments(self, name: str, raw: str) -> dict[str, Any]:
        """Decode and validate a call's arguments; raises ToolError with a message for the model."""
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            raise ToolError(f"Error: unknown tool {name!r}. Available tools: {known}.")
        try:
            args = (
                json.loads(raw, parse_constant=_not_json_number, parse_float=_finite_float)
                if raw and raw.strip()
                else {}
            )
        except json.JSONDecodeError as exc:
            raise ToolError(f"Error: arguments for {name!r} are not valid JSON ({exc.msg} at position {exc.pos}).") from exc
        except ValueError as exc:  # NaN, Infinity, a float beyond double range
            raise ToolError(f"Error: arguments for {name!r} are not valid JSON ({exc}).") from None
        except RecursionError:
            raise ToolError(f"Error: arguments for {name!r} are nested too deeply.") from None
        if not isinstance(args, dict):
            raise ToolError(f"Error: arguments for {name!r} must be a JSON object, got {type(args).__name__}.")
        try:
            errors = sorted(self._validators[name].iter_errors(args), key=lambda e: list(e.path))
        except RecursionError:
            raise ToolError(f"Error: arguments for {name!r} are nested too deeply.") from None
        if errors:
            details = "; ".join(_describe(e) for e in errors[:5])
            raise ToolError(f"Error: invalid arguments for {name!r}: {details}")
        return args


def _describe(error: Any) -> str:
    where = "/".join(str(p) for p in error.path) or "(root)"
    message = str(error.message)
    if len(message) > 200:
        message = message[:200] + "…"
    return f"{where}: {message}"
