"""The configured MCP servers (``mcp.servers``) as specs the agent's MCP client runs, and their doctor check.

A stdio server runs in the tool sandbox like every tool process (``sandboxed``): it is
shared by all sessions, so it gets a directory of its own, sees the workspace root
read-only and no session's directory, never botd's files, and only its declared
environment; ``network: false`` also cuts it off the network.

``${VAR}`` in ``env`` and ``headers`` is taken from the daemon's environment here,
explicitly, and the resolved values are registered as secrets so logs redact
them. A reference to an unset variable is a configuration error naming the key.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.tools.environment import expand_env_refs
from agent.tools.mcp import probe_servers
from agent.tools.mcp_spec import CommandWrapper, McpServerSpec
from agent.tools.registry import ToolSettings
from agent.tools.sandbox import SandboxCommand
from agent.types import Category
from bot.config import BotdConfig, ConfigError, McpServerConfig
from bot.logs import register_secret
from bot.workspaces import CHATS_DIR, USERS_DIR

MCP_DIR = "mcp"  # <workspace>/mcp/<server>: a stdio server's working directory, its only writable place

Check = tuple[str, bool, str]


def server_specs(cfg: BotdConfig, environ: Mapping[str, str] | None = None) -> list[McpServerSpec]:
    """Every enabled server of ``mcp.servers``; raises ``ConfigError`` for an unresolvable ``${VAR}``."""
    source = os.environ if environ is None else environ
    return [_spec(name, server, source) for name, server in cfg.mcp.servers.items() if server.enabled]


def _spec(name: str, server: McpServerConfig, environ: Mapping[str, str]) -> McpServerSpec:
    def resolve(field: str, values: dict[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in values.items():
            try:
                out[key] = expand_env_refs(value, environ)
            except ValueError as exc:
                raise ConfigError(f"config error: mcp.servers.{name}.{field}.{key}: {exc}") from None
            if out[key] != value:
                register_secret(out[key])
        return out

    categories: dict[str, Category] = {
        tool: rule.category for tool, rule in server.tools.items() if rule.category is not None
    }
    return McpServerSpec(
        name=name,
        transport="stdio" if server.command is not None else server.transport,
        command=server.command,
        args=tuple(server.args),
        env=resolve("env", server.env),
        url=server.url,
        headers=resolve("headers", server.headers),
        category=server.category,
        tool_categories=categories,
        enabled_tools=frozenset(server.enabled_tools) if server.enabled_tools is not None else None,
        disabled_tools=frozenset(server.disabled_tools),
        timeout_s=server.timeout_s,
        startup_timeout_s=server.startup_timeout_s,
        network=server.network,
    )


async def doctor_checks(cfg: BotdConfig, wrapper: CommandWrapper) -> list[Check]:
    """One check per enabled server: spawn or connect, list the tools, report the count or the error."""
    checks: list[Check] = []
    specs: list[McpServerSpec] = []
    for name, server in cfg.mcp.servers.items():
        if not server.enabled:
            continue
        try:
            specs.append(_spec(name, server, os.environ))
        except ConfigError as exc:
            checks.append((f"mcp:{name}", False, str(exc)))
    statuses = await probe_servers(
        specs, cwd=cfg.workspace, env_allowlist=tuple(cfg.security.env_allowlist), wrapper=wrapper
    )
    for status in statuses:
        ok = status.last_error is None
        detail = f"{status.transport}, {status.tools} tools offered" if ok else status.last_error
        checks.append((f"mcp:{status.name}", ok, detail or ""))
    return checks


def sandboxed(settings: ToolSettings) -> CommandWrapper:
    """How the daemon runs a stdio MCP server: confined in ``settings.sandbox``."""
    root = settings.workspace
    writable_extra = tuple(path for path in settings.allowed_paths if path != root)
    hidden = (*settings.masked_paths, root / USERS_DIR, root / CHATS_DIR)

    def wrap(server: McpServerSpec, argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> SandboxCommand:
        if shutil.which(argv[0], path=env.get("PATH")) is None:
            # Found here, the error says "could not start" instead of the sandbox's exec failure.
            raise FileNotFoundError(errno.ENOENT, "no such program", argv[0])
        home = root / MCP_DIR / server.name
        home.mkdir(parents=True, exist_ok=True)
        for sessions in hidden[-2:]:  # masked only if present when the server starts: make them so
            sessions.mkdir(parents=True, exist_ok=True)
        sandbox = settings.sandbox
        if sandbox.network != server.network:
            sandbox = dataclasses.replace(sandbox, network=server.network)
        return sandbox.wrap(
            argv, cwd=home, env=env, writable=(home, *writable_extra),
            readonly=(root, *settings.readonly_paths, *_program_dirs(argv, env)), hidden=hidden,
        )

    return wrap


def _program_dirs(argv: Sequence[str], env: Mapping[str, str]) -> list[Path]:
    """The server's own program and files, visible read-only even where the sandbox hides
    the host's tree (a private /tmp): the program's prefix (a virtualenv's root, say) and
    the directory of every absolute path among its arguments."""
    found = shutil.which(argv[0], path=env.get("PATH"))
    dirs = [Path(found).absolute().parent.parent] if found else []
    dirs += [Path(arg).parent for arg in argv[1:] if arg.startswith("/") and Path(arg).exists()]
    return dirs

