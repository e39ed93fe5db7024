"""The configured MCP servers (``mcp.servers``) as specs the agent's MCP client runs, and their doctor check.

``${VAR}`` in ``env`` and ``headers`` is taken from the daemon's environment here,
explicitly, and the resolved values are registered as secrets so logs redact
them. A reference to an unset variable is a configuration error naming the key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from agent.tools.environment import expand_env_refs
from agent.tools.mcp import probe_servers
from agent.tools.mcp_spec import McpServerSpec
from agent.types import Category
from bot.config import BotdConfig, ConfigError, McpServerConfig
from bot.logs import register_secret

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
    )


async def doctor_checks(cfg: BotdConfig) -> list[Check]:
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
    statuses = await probe_servers(specs, cwd=cfg.workspace, env_allowlist=tuple(cfg.security.env_allowlist))
    for status in statuses:
        ok = status.last_error is None
        detail = f"{status.transport}, {status.tools} tools offered" if ok else status.last_error
        checks.append((f"mcp:{status.name}", ok, detail or ""))
    return checks
