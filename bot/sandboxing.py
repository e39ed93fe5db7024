"""The tool sandbox of this daemon: built once from ``security.*``, announced loudly when off.

What tools must never see is decided here, on the bot side, because only the bot
knows where its own files are: the config file, ``<workspace>/.botd`` (store socket,
data, password, daemon key) and the configured denied paths.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from agent.tools.sandbox import Sandbox, SandboxUnavailable, ToolLimits
from bot import metrics
from bot.config import BotdConfig, ConfigError
from bot.store.embedded import STATE_DIR_NAME

log = structlog.get_logger(__name__)


def hidden_paths(cfg: BotdConfig) -> list[Path]:
    """botd's own files, masked in the sandbox and always denied to the file tools."""
    paths = [cfg.workspace / STATE_DIR_NAME, *(Path(p).expanduser() for p in cfg.security.denied_paths)]
    if cfg.source is not None:
        paths.append(cfg.source.resolve())
    return paths


def build_sandbox(cfg: BotdConfig) -> Sandbox:
    """Probe and build; ``bwrap`` that cannot run is a config error, ``auto`` falls back loudly."""
    sec = cfg.security
    limits = ToolLimits(**sec.tool_limits.model_dump())
    try:
        sandbox = Sandbox.from_mode(sec.sandbox, network=sec.sandbox_network, limits=limits, hidden=hidden_paths(cfg))
    except SandboxUnavailable as exc:
        raise ConfigError(
            f"config error: security.sandbox: bwrap cannot run here ({exc}); install bubblewrap "
            "and allow user namespaces, or set security.sandbox: auto"
        ) from None
    metrics.SANDBOX_ACTIVE.set(1 if sandbox.active else 0)
    if sandbox.active:
        log.info("security.sandbox", state=sandbox.describe())
    else:
        log.warning(
            "security.sandbox_off",
            state=sandbox.describe(),
            fix="install bubblewrap (apt-get install bubblewrap) and allow user namespaces; see README, Security model",
        )
    return sandbox
