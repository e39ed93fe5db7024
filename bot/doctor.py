"""``botd doctor``: would ``botd run`` start with this config, and would it work?

The config goes through the same checks ``run`` makes before starting (a problem there
exits 2, as ``run`` would); then the live checks run (Redis, the LLM endpoint, every
channel's token). Each line says ``ok``, ``warn``, ``off`` or ``FAIL``; a failure carries
its fix on the same line. Exit 1 when any check failed, else 0 (warnings do not fail).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from agent.tools.mcp_spec import run_directly
from agent.tools.sandbox import Sandbox
from bot.app import check_config, tool_settings
from bot.config import BotdConfig, ConfigError
from bot.probes import Probe, check_slack, check_telegram, probe_llm
from bot.store.connection import open_redis
from bot.store.errors import StoreError

Status = Literal["ok", "warn", "off", "FAIL"]
TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Finding:
    status: Status
    name: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status:<4}  {self.name}: {self.detail}"
        return f"{text}. Fix: {self.fix}" if self.fix else text


def _secret(value: object) -> str:
    reveal = getattr(value, "get_secret_value", None)
    return str(reveal()) if callable(reveal) else ""


async def _live(name: str, probe: Callable[[], Awaitable[Probe]]) -> Finding:
    try:
        async with asyncio.timeout(TIMEOUT_S):
            result = await probe()
    except TimeoutError:
        return Finding("FAIL", name, f"no answer within {TIMEOUT_S:g} s", "check the network and the address")
    return Finding("ok" if result.ok else "FAIL", name, result.detail, result.fix)


async def _redis(cfg: BotdConfig) -> Finding:
    try:
        handle = await open_redis(cfg.redis, cfg.workspace)
    except StoreError as exc:
        fix = "check redis.url (or REDIS_URL)" if cfg.redis.url else "check that the workspace is writable"
        return Finding("FAIL", "redis", str(exc), fix)
    try:
        answered = await handle.ping()
        kind = "embedded Valkey" if handle.embedded else "Redis"
        if not answered:
            return Finding("FAIL", "redis", f"{kind} at {handle.url} does not answer PING", "restart it")
        return Finding("ok", "redis", f"{kind} at {handle.url} answers")
    finally:
        await handle.close()


def _access_findings(name: str, policy: str, allow_from: list[str]) -> list[Finding]:
    if policy == "allowlist" and not allow_from:
        return [Finding("warn", name, f"{name}.allow_from is empty with dm_policy allowlist: nobody can talk to "
                        "the bot", f"add your user id to {name}.allow_from, or set {name}.dm_policy: pairing")]
    if policy == "open":
        return [Finding("warn", name, f"{name}.dm_policy is open: anyone who finds the bot can use it (and your "
                        "LLM budget)")]
    return []


async def _telegram(cfg: BotdConfig) -> list[Finding]:
    tg = cfg.telegram
    if not tg.enabled:
        return [Finding("off", "telegram", "disabled (telegram.enabled: false)")]
    token = _secret(tg.token)
    found = [await _live("telegram", lambda: check_telegram(token, tg.api_base_url))]
    return found + _access_findings("telegram", tg.dm_policy, tg.allow_from)


async def _slack(cfg: BotdConfig) -> list[Finding]:
    sl = cfg.slack
    if not sl.enabled:
        return [Finding("off", "slack", "disabled (slack.enabled: false)")]
    try:
        async with asyncio.timeout(TIMEOUT_S):
            probes = await check_slack(_secret(sl.bot_token), _secret(sl.app_token), sl.api_base_url,
                                       socket_mode=sl.mode == "socket")
    except TimeoutError:
        probes = [Probe(False, f"no answer within {TIMEOUT_S:g} s", "check the network and slack.api_base_url")]
    found = [Finding("ok" if p.ok else "FAIL", "slack", p.detail, p.fix) for p in probes]
    return found + _access_findings("slack", sl.dm_policy, sl.allow_from)


def _heartbeat(cfg: BotdConfig) -> list[Finding]:
    hb = cfg.heartbeat
    if not hb.enabled:
        return [Finding("off", "heartbeat", "disabled (heartbeat.enabled: false)")]
    if not (hb.target.channel and hb.target.chat_id):
        return [Finding("warn", "heartbeat", "enabled without heartbeat.target: its reports go nowhere",
                        "set heartbeat.target.channel and heartbeat.target.chat_id")]
    channel = hb.target.channel
    if channel in ("telegram", "slack") and not getattr(cfg, channel).enabled:
        return [Finding("warn", "heartbeat", f"heartbeat.target.channel is {channel}, which is disabled",
                        f"enable {channel} or change heartbeat.target")]
    return [Finding("ok", "heartbeat", f"every {hb.every} to {channel}:{hb.target.chat_id}")]


def _sandbox(cfg: BotdConfig) -> tuple[Finding, Sandbox | None]:
    """ok when tool processes will be confined; ``auto`` without bubblewrap warns with the fix."""
    from bot.sandboxing import build_sandbox

    try:
        sandbox = build_sandbox(cfg)
    except ConfigError as exc:
        return Finding("FAIL", "sandbox", str(exc), "apt-get install bubblewrap, or security.sandbox: auto"), None
    if sandbox.active:
        return Finding("ok", "sandbox", sandbox.describe()), sandbox
    return Finding("warn", "sandbox", sandbox.describe(),
                   "apt-get install bubblewrap and allow user namespaces (README, Security model)"), sandbox


async def _mcp(cfg: BotdConfig, sandbox: Sandbox | None) -> list[Finding]:
    """Each enabled MCP server started (stdio: in the sandbox, as the daemon would) and listed."""
    if not any(server.enabled for server in cfg.mcp.servers.values()):
        return []
    from bot.mcp_servers import doctor_checks, sandboxed

    wrapper = sandboxed(tool_settings(cfg, sandbox)) if sandbox is not None else run_directly
    return [
        Finding("ok" if ok else "FAIL", name, detail, "" if ok else f"check mcp.servers.{name.removeprefix('mcp:')}")
        for name, ok, detail in await doctor_checks(cfg, wrapper)
    ]


async def run_checks(cfg: BotdConfig) -> list[Finding]:
    """Every finding, in a stable order; assumes :func:`check_config` passed."""
    source = str(cfg.source) if cfg.source is not None else "no file (defaults and environment)"
    sandbox_finding, sandbox = _sandbox(cfg)
    findings = [Finding("ok", "config", source), sandbox_finding]
    findings.append(await _redis(cfg))
    api_key = _secret(cfg.llm.api_key) or None
    findings.append(await _live("llm", lambda: probe_llm(cfg.llm.base_url, api_key, cfg.llm.model)))
    findings.extend(await _telegram(cfg))
    findings.extend(await _slack(cfg))
    findings.extend(_heartbeat(cfg))
    findings.extend(await _mcp(cfg, sandbox))
    return findings


async def doctor(cfg: BotdConfig) -> int:
    try:
        check_config(cfg)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    findings = await run_checks(cfg)
    for finding in findings:
        print(finding.line())
    failed = [f for f in findings if f.status == "FAIL"]
    if failed:
        print(f"{len(failed)} check(s) failed.")
        return 1
    print("All checks passed." if not any(f.status == "warn" for f in findings) else "Passed, with warnings.")
    return 0
