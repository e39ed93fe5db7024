"""Builds the daemon's object graph from the config: store, model, tools, channels,
gateway, scheduler. One place decides what talks to what."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from agent.llm import LLMClient
from agent.llm_types import ChatModel
from agent.tools.builtin import load_tools
from agent.tools.cli_tools import ToolConfigError
from agent.tools.registry import ToolRegistry, ToolSettings
from bot.compactor import SessionCompactor
from bot.config import BotdConfig, ConfigError
from bot.gateway.approvals import Approvals
from bot.gateway.control import COMMANDS, ControlCommands
from bot.gateway.gateway import Gateway
from bot.gateway.reply import DeliveryLedger
from bot.gateway.run import RunDeps, RunExecutor
from bot.gateway.signals import Broadcast
from bot.logs import register_secret
from bot.models import ModelCatalog, build_client
from bot.scheduled_runner import GatewayScheduledRunner
from bot.session_keys import cron_session_key, heartbeat_session_key, session_key
from bot.store.connection import RedisHandle
from bot.store.kv import RedisKeyValue
from bot.store.locks import SessionLock
from bot.store.sessions import SessionStore
from bot.tracing import TraceStore
from channels.base import ChannelAdapter, ChannelContext, RouteHandler, Scope
from scheduler.cron_tool import CronTool
from scheduler.service import SchedulerService
from scheduler.settings import HeartbeatSettings, SchedulerSettings
from scheduler.store import JobStore


def replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def tool_settings(cfg: BotdConfig) -> ToolSettings:
    return ToolSettings(
        workspace=cfg.workspace,
        allowed_paths=tuple(Path(p) for p in cfg.allowed_paths()),
        # The store's own files (embedded Valkey data and socket) are never a tool's business.
        denied_paths=(*(Path(p).expanduser() for p in cfg.security.denied_paths), cfg.workspace / ".botd"),
        timeout_s=cfg.security.tool_timeout_s,
        max_output_bytes=cfg.security.max_tool_output_bytes,
        env_allowlist=tuple(cfg.security.env_allowlist),
    )


def build_model(cfg: BotdConfig) -> LLMClient:
    """The client of the default model (``llm.model``)."""
    return build_client(cfg, cfg.llm.model)


def build_channels(cfg: BotdConfig) -> dict[str, ChannelAdapter]:
    """The enabled platform channels (imported lazily: each pulls in its SDK)."""
    out: dict[str, ChannelAdapter] = {}
    if cfg.telegram.enabled:
        from channels.telegram import TelegramChannel, TelegramSettings

        settings = TelegramSettings.from_config(cfg.telegram)
        register_secret(settings.token)
        register_secret(settings.webhook_secret)
        out["telegram"] = TelegramChannel(settings)
    if cfg.slack.enabled:
        from channels.slack import SlackChannel, SlackSettings

        slack = SlackSettings.from_config(cfg.slack)
        for secret in (slack.bot_token, slack.app_token, slack.signing_secret):
            register_secret(secret)
        out["slack"] = SlackChannel(slack)
    return out


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
        self.jobs = JobStore(client, keys)
        self.tool_settings = tool_settings(cfg)
        try:
            declared = load_tools(self.tool_settings, cfg.security.cli_tools_file)
        except ToolConfigError as exc:
            raise ConfigError(f"config error: security.cli_tools_file: {exc}") from None
        self.tools = ToolRegistry([*declared, CronTool(self.jobs, default_timezone=cfg.scheduler.timezone)])
        self.broadcast = Broadcast(client)
        self.ledger = DeliveryLedger(client, prefix)
        self.approvals = Approvals(client, prefix, self.broadcast, cfg.gateway.approval_timeout_s)
        self.traces = TraceStore(client, prefix)
        self.models = ModelCatalog(cfg, self.model)
        self.models.check()
        self.compactor = SessionCompactor(
            self.sessions, client, prefix, self.model, self.tool_settings, cfg, models=self.models.client
        )
        self.executor = RunExecutor(
            RunDeps(
                cfg=cfg, sessions=self.sessions, model=self.model, tools=self.tools,
                tool_settings=self.tool_settings, channels=self.channels, ledger=self.ledger,
                approvals=self.approvals, traces=self.traces, compactor=self.compactor, models=self.models,
            )
        )
        self.control = ControlCommands(
            client, prefix, self.channels, self.sessions, self.approvals, self.ledger,
            models=self.models, compactor=self.compactor, traces=self.traces,
        )

        def lock_factory(session: str, on_lost: Callable[[], None]) -> SessionLock:
            return SessionLock(client, keys, session, ttl_s=cfg.gateway.lock_ttl_s, owner=self.replica,
                               on_lost=on_lost)

        self.gateway = Gateway(
            cfg, client, self.executor, self.channels, self.broadcast, self.ledger, self.control, lock_factory
        )
        self.scheduler = SchedulerService(
            client, keys, GatewayScheduledRunner(self.gateway, self.channels),
            signals=self.broadcast,
            heartbeat=HeartbeatSettings.from_config(cfg.heartbeat),
            settings=SchedulerSettings.from_config(cfg.scheduler),
            workspace=cfg.workspace,
            session_key_for_job=partial(cron_session_key, cfg.agent.id),
            heartbeat_session_key=heartbeat_session_key(cfg.agent.id),
            agent_id=cfg.agent.id,
            instance_id=self.replica,
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
        )
