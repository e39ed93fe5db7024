"""Builds the daemon's object graph from the config: store, model, tools, channels,
gateway, scheduler. One place decides what talks to what."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from agent.images import require_pillow
from agent.llm import LLMClient
from agent.llm_types import ChatModel
from agent.tools.builtin import load_tools
from agent.tools.cli_tools import ToolConfigError
from agent.tools.mcp import McpManager
from agent.tools.registry import Tool, ToolRegistry, ToolSettings
from agent.tools.sandbox import Sandbox
from agent.types import RunRequest
from bot.compactor import SessionCompactor
from bot.config import BotdConfig, ConfigError
from bot.gateway.approvals import Approvals
from bot.gateway.control import COMMANDS, ControlCommands
from bot.gateway.gateway import Gateway
from bot.gateway.redelivery import Redelivery
from bot.gateway.reply import DeliveryLedger
from bot.gateway.run import RunDeps, RunExecutor
from bot.gateway.run_control import OutcomeStatus, RunOutcome
from bot.gateway.signals import Broadcast
from bot.logs import register_secret
from bot.mcp_servers import sandboxed, server_specs
from bot.models import ModelCatalog, build_client, check_models
from bot.pairing import ApprovalNotices, ChannelPairing, PairingStore
from bot.sandboxing import build_sandbox, hidden_paths
from bot.session_keys import cron_session_key, heartbeat_session_key, session_key
from bot.store.connection import RedisHandle
from bot.store.kv import RedisKeyValue
from bot.store.locks import SessionLock
from bot.store.owned import OwnedKeys
from bot.store.seal import RecordSeal
from bot.store.sessions import SessionStore
from bot.tracing import TraceStore
from bot.workspaces import SessionWorkspaces
from channels.base import ChannelAdapter, ChannelContext, RouteHandler, Scope, Target
from scheduler.cron_tool import CronTool
from scheduler.ports import JobTarget, ScheduledOutcome, ScheduledRunStatus
from scheduler.service import SchedulerService
from scheduler.settings import HeartbeatSettings, SchedulerSettings
from scheduler.store import JobStore

if TYPE_CHECKING:
    from channels.slack import SlackSettings
    from channels.telegram import TelegramSettings

log = structlog.get_logger(__name__)


def replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def tool_settings(cfg: BotdConfig, sandbox: Sandbox | None = None) -> ToolSettings:
    """``sandbox`` None (config checks): tools unconfined; the daemon passes the probed one."""
    return ToolSettings(
        workspace=cfg.workspace,
        allowed_paths=tuple(Path(p) for p in cfg.allowed_paths()),
        # The store's own files (embedded Valkey data and socket) are never a tool's business.
        denied_paths=tuple(hidden_paths(cfg)),
        timeout_s=cfg.security.tool_timeout_s,
        max_output_bytes=cfg.security.max_tool_output_bytes,
        env_allowlist=tuple(cfg.security.env_allowlist),
        sandbox=sandbox or Sandbox(bwrap=None, reason="not probed"),
    )


def llm_api_key(cfg: BotdConfig) -> str | None:
    """The API key, or None for a keyless endpoint; without either, a config error."""
    key = cfg.llm.api_key.get_secret_value() if cfg.llm.api_key else None
    if key is None and cfg.llm.base_url is None:
        raise ConfigError(
            "config error: llm.api_key: required when llm.base_url is not set (or set OPENAI_API_KEY)"
        )
    return key



def build_model(cfg: BotdConfig) -> LLMClient:
    """The client of the default model (``llm.model``)."""
    llm_api_key(cfg)  # the default model's check, with the message start-up checks give
    return build_client(cfg, cfg.llm.model)


def declared_tools(cfg: BotdConfig, settings: ToolSettings) -> list[Tool]:
    """Built-in tools plus the CLI tools file, checked completely (a mistake is a config error)."""
    try:
        return load_tools(settings, cfg.cli_tools_path())
    except ToolConfigError as exc:
        raise ConfigError(f"config error: security.cli_tools_file: {exc}") from None


def channel_settings(cfg: BotdConfig) -> tuple[TelegramSettings | None, SlackSettings | None]:
    """The enabled channels' settings; a value the adapter refuses is a config error."""
    telegram: TelegramSettings | None = None
    slack: SlackSettings | None = None
    try:
        # Each import pulls in that platform's SDK: only for a channel that is enabled.
        if cfg.telegram.enabled:
            from channels.telegram import TelegramSettings

            telegram = TelegramSettings.from_config(cfg.telegram)
        if cfg.slack.enabled:
            from channels.slack import SlackSettings

            slack = SlackSettings.from_config(cfg.slack)
    except ValueError as exc:
        raise ConfigError(f"config error: {exc}") from None
    return telegram, slack


def check_config(cfg: BotdConfig, *, model: bool = True, channels: bool = True) -> None:
    """What ``botd run`` refuses before starting anything; ``botd doctor`` runs the same.

    ``model``/``channels`` False skip the parts a caller supplies itself (tests, ``botd chat``).
    """
    if model:
        llm_api_key(cfg)
        check_models(cfg)
    declared_tools(cfg, tool_settings(cfg))
    if cfg.llm.vision:
        try:
            require_pillow()
        except ImportError as exc:
            raise ConfigError(f"config error: llm.vision: {exc}, or set llm.vision: false") from None
    if channels:
        channel_settings(cfg)


def build_channels(cfg: BotdConfig) -> dict[str, ChannelAdapter]:
    """The enabled platform channels (imported lazily: each pulls in its SDK)."""
    telegram, slack = channel_settings(cfg)
    out: dict[str, ChannelAdapter] = {}
    if telegram is not None:
        from channels.telegram import TelegramChannel

        register_secret(telegram.token)
        register_secret(telegram.webhook_secret)
        out["telegram"] = TelegramChannel(telegram)
    if slack is not None:
        from channels.slack import SlackChannel

        for secret in (slack.bot_token, slack.app_token, slack.signing_secret):
            register_secret(secret)
        out["slack"] = SlackChannel(slack)
    return out


# A run's outcome in the scheduler's words (its ledger's ``run_status``), every
# ``OutcomeStatus`` once; a status this version does not know reads as an error.
SCHEDULED_STATUS: dict[OutcomeStatus, ScheduledRunStatus] = {
    "completed": "ok",
    "max_iterations": "ok",
    "failed": "error",
    "cancelled": "error",
    "timeout": "timeout",
    "blocked": "skipped",
}


def scheduled_outcome(outcome: RunOutcome) -> ScheduledOutcome:
    """The gateway's outcome of a scheduled run as the scheduler records it."""
    return ScheduledOutcome(
        outcome.run_id,
        SCHEDULED_STATUS.get(outcome.status, "error"),
        "unknown" if outcome.delivery == "none" else outcome.delivery,
        outcome.error,
    )


class ScheduledRunner:
    """The daemon's side of the scheduler (``scheduler.ports.ScheduledRunner``): a fire is
    submitted to the gateway like a chat message, and its outcome awaited on the board."""

    def __init__(self, gateway: Gateway, channels: Mapping[str, ChannelAdapter]) -> None:
        self._gateway = gateway
        self._channels = channels

    async def run_scheduled(self, request: RunRequest, *, timeout_s: float) -> ScheduledOutcome:
        req = request.model_copy(update={"meta": {**request.meta, "timeout_s": str(timeout_s)}})
        if req.channel not in self._channels:
            return ScheduledOutcome(req.run_id, "error", "failed", f"channel {req.channel!r} is not enabled")
        accepted = await self._gateway.submit(req)
        if accepted.status in ("error", "dropped"):
            return ScheduledOutcome(req.run_id, "error", "unknown", f"not accepted: {accepted.detail}")
        if accepted.status == "duplicate":
            return ScheduledOutcome(req.run_id, "skipped", "unknown", "duplicate fire")
        outcome = await self._gateway.outcomes.wait(req.run_id, timeout_s + 30)
        if outcome is None:
            return ScheduledOutcome(req.run_id, "timeout", "unknown", "no outcome within the run timeout")
        return scheduled_outcome(outcome)

    async def is_busy(self, session_key: str) -> bool:
        return await self._gateway.is_busy(session_key)

    async def notify(self, target: JobTarget, text: str) -> None:
        channel = self._channels.get(target.channel)
        if channel is None:
            log.warning("scheduler.notify_no_channel", channel=target.channel)
            return
        await channel.send_text(Target(channel=target.channel, chat_id=target.chat_id, thread_id=target.thread_id), text)


@dataclass
class App:
    """Every long-lived part of one botd process."""

    cfg: BotdConfig
    store: RedisHandle
    model: ChatModel
    channels: dict[str, ChannelAdapter]
    replica: str = field(default_factory=replica_id)

    def __post_init__(self) -> None:
        cfg, client, prefix = self.cfg, self.store.client, self.cfg.redis.prefix
        keys = self.store.keys
        self.sessions = SessionStore(client, keys)
        self.seal = RecordSeal.for_config(cfg)
        self.jobs = JobStore(client, keys, self.seal)
        self.sandbox = build_sandbox(cfg)
        self.tool_settings = tool_settings(cfg, self.sandbox)
        declared = declared_tools(cfg, self.tool_settings)
        self.tools = ToolRegistry([*declared, CronTool(self.jobs, default_timezone=cfg.scheduler.timezone)])
        # MCP servers add their tools to the same registry as they connect (started by the daemon).
        self.mcp = McpManager(
            server_specs(cfg), self.tools, cwd=cfg.workspace, env_allowlist=self.tool_settings.env_allowlist,
            wrapper=sandboxed(self.tool_settings),
        )
        self.broadcast = Broadcast(client)
        self.ledger = DeliveryLedger(client, prefix)
        self.redelivery = Redelivery(client, keys, self.channels, self.ledger)
        self.approvals = Approvals(client, prefix, self.broadcast, cfg.gateway.approval_timeout_s, seal=self.seal)
        self.traces = TraceStore(client, prefix)
        self.pairing = PairingStore(client, keys)
        notices = ApprovalNotices(client, keys, self.channels)
        self.broadcast.on(keys.pairing_events(), notices.on_event)
        self.models = ModelCatalog(cfg, self.model)
        self.workspaces = SessionWorkspaces(self.tool_settings, cfg.agent.workspace_scope)
        self.compactor = SessionCompactor(
            self.sessions, client, prefix, self.model, self.tool_settings, cfg, models=self.models.client
        )
        self.executor = RunExecutor(
            RunDeps(
                cfg=cfg, sessions=self.sessions, model=self.model, tools=self.tools,
                tool_settings=self.tool_settings, channels=self.channels, ledger=self.ledger,
                approvals=self.approvals, traces=self.traces, compactor=self.compactor,
                redelivery=self.redelivery, models=self.models, workspaces=self.workspaces,
            )
        )
        self.control = ControlCommands(
            self.channels, self.sessions, self.approvals, self.ledger,
            models=self.models, compactor=self.compactor, traces=self.traces, workspaces=self.workspaces,
        )

        def lock_factory(session: str, on_lost: Callable[[], None]) -> SessionLock:
            return SessionLock(client, keys, session, ttl_s=cfg.gateway.lock_ttl_s, owner=self.replica,
                               on_lost=on_lost)

        self.gateway = Gateway(
            cfg, client, self.executor, self.channels, self.broadcast, self.ledger, self.control, lock_factory
        )
        heartbeat = HeartbeatSettings.from_config(cfg.heartbeat)
        target = heartbeat.target
        self.scheduler = SchedulerService(
            client, keys, ScheduledRunner(self.gateway, self.channels),
            owned=OwnedKeys(client),
            signals=self.broadcast,
            heartbeat=heartbeat,
            settings=SchedulerSettings.from_config(cfg.scheduler),
            workspace=cfg.workspace,
            heartbeat_dirs=(lambda: self.workspaces.lookup_dirs(target.channel, target.chat_id)) if target else None,
            session_key_for_job=partial(cron_session_key, cfg.agent.id),
            heartbeat_session_key=heartbeat_session_key(cfg.agent.id),
            agent_id=cfg.agent.id,
            instance_id=self.replica,
            seal=self.seal,
        )

    def channel_context(self, name: str, add_route: Callable[[str, str, RouteHandler], None]) -> ChannelContext:
        agent_id = self.cfg.agent.id

        def key(scope: Scope, chat_id: str, *, thread: str | None = None, topic: str | None = None) -> str:
            return session_key(agent_id, name, scope, chat_id, thread=thread, topic=topic)

        return ChannelContext(
            submit=self.gateway.submit,
            session_key=key,
            kv=RedisKeyValue(self.store.client, self.cfg.redis.prefix),
            add_route=add_route,
            replica_id=self.replica,
            commands=COMMANDS,
            pairing=ChannelPairing(self.pairing, name, self.channels, self.gateway.dedupe) if self._pairs(name) else None,
        )

    def _pairs(self, channel: str) -> bool:
        if channel == "telegram":
            return self.cfg.telegram.dm_policy == "pairing"
        return channel == "slack" and self.cfg.slack.dm_policy == "pairing"
