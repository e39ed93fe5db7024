"""The configuration model (DESIGN.md §4.2): every key, its default and its rules.

Every value is checked here, once, when the config is loaded (``config_file.py`` finds
and reads it). A bad value raises :class:`ConfigError` naming the key; the CLI exits 2.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


class ConfigError(Exception):
    """A configuration problem, already phrased for the operator (names the key)."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class AgentConfig(_Section):
    id: str = Field("main", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    workspace: Path = Path("~/.botd/workspace")
    max_iterations: int = Field(20, ge=1, le=200)
    history_turns: int = Field(50, ge=1)
    max_message_chars: int = Field(32768, ge=256)
    workspace_scope: Literal["user", "shared"] = "user"


class PriceConfig(_Section):
    """What a model costs, per million tokens (in whatever currency you bill in)."""

    prompt_per_mtok: float = Field(0, ge=0)
    completion_per_mtok: float = Field(0, ge=0)


class ModelConfig(_Section):
    """One entry of ``llm.models``; an unset key falls back to the ``llm`` section's value."""

    context_window: int | None = Field(None, ge=1024)
    max_output_tokens: int | None = Field(None, ge=1)
    base_url: str | None = None
    api_key: SecretStr | None = None
    price: PriceConfig | None = None


# A model id is sent to the API and typed after /model: printable, no spaces.
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$")


class LLMConfig(_Section):
    base_url: str | None = None
    api_key: SecretStr | None = None
    model: str = "gpt-4o-mini"
    context_window: int = Field(128000, ge=1024)
    max_output_tokens: int = Field(4096, ge=1)
    request_timeout_s: float = Field(120, gt=0)
    max_retries: int = Field(3, ge=0, le=10)
    vision: bool = False  # also send images as image_url parts (the model must accept them)
    price: PriceConfig | None = None  # of llm.model, unless llm.models lists it with its own
    models: dict[str, ModelConfig] = Field(default_factory=dict)

    @field_validator("models", mode="before")
    @classmethod
    def _model_entries(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: ({} if v is None else v) for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _check_ids(self) -> LLMConfig:
        for key, model_id in (("llm.model", self.model), *(("llm.models", m) for m in self.models)):
            if not _MODEL_ID.match(model_id):
                raise ValueError(
                    f"{key}: {model_id[:60]!r} is not a usable model id "
                    "(letters, digits and . _ : / @ + -, no spaces, at most 200 characters)"
                )
        return self


class RedisConfig(_Section):
    url: str | None = None
    prefix: str = Field("botd", pattern=r"^[A-Za-z0-9_.-]{1,64}$")


class HTTPConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(1_048_576, ge=1024)


class TelegramConfig(_Section):
    enabled: bool = False
    token: SecretStr | None = None
    api_base_url: str | None = None
    mode: Literal["polling", "webhook"] = "polling"
    webhook_url: str | None = None
    webhook_secret: SecretStr | None = None
    webhook_path: str = "/telegram"
    dm_policy: Literal["allowlist", "open", "pairing"] = "allowlist"
    allow_from: list[str] = Field(default_factory=list)
    groups: list[str] = Field(default_factory=list)
    require_mention: bool = True
    stream_edit_interval_s: float = Field(1.0, ge=0.2)
    poll_lease_s: float = Field(30, ge=2)  # polling leader's lease; a dead leader is replaced within it

    @field_validator("allow_from", "groups", mode="before")
    @classmethod
    def _ids_as_strings(cls, value: Any) -> Any:
        return _string_list(value)

    @model_validator(mode="after")
    def _check(self) -> TelegramConfig:
        if self.enabled and self.token is None:
            raise ValueError("telegram.token is required when telegram.enabled is true")
        if self.enabled and self.mode == "webhook" and not self.webhook_url:
            raise ValueError("telegram.webhook_url is required in webhook mode")
        return self


class SlackConfig(_Section):
    enabled: bool = False
    bot_token: SecretStr | None = None
    app_token: SecretStr | None = None
    signing_secret: SecretStr | None = None
    mode: Literal["socket", "http"] = "socket"
    api_base_url: str | None = None
    events_path: str = "/slack/events"
    dm_policy: Literal["allowlist", "open", "pairing"] = "allowlist"
    allow_from: list[str] = Field(default_factory=list)
    channels: list[str] = Field(default_factory=list)
    require_mention: bool = True

    @field_validator("allow_from", "channels", mode="before")
    @classmethod
    def _ids_as_strings(cls, value: Any) -> Any:
        return _string_list(value)

    @model_validator(mode="after")
    def _check(self) -> SlackConfig:
        if not self.enabled:
            return self
        if self.bot_token is None:
            raise ValueError("slack.bot_token is required when slack.enabled is true")
        if self.mode == "socket" and self.app_token is None:
            raise ValueError("slack.app_token is required in socket mode")
        if self.mode == "http" and self.signing_secret is None:
            raise ValueError("slack.signing_secret is required in http mode")
        return self


class GuardConfig(_Section):
    action: str = "warn"

    @field_validator("action")
    @classmethod
    def _known(cls, value: str) -> str:
        # An unknown action falls back to warn (DESIGN.md §5), it is not an error.
        value = str(value).strip().lower()
        return value if value in {"off", "log", "warn", "block"} else "warn"


class QueueConfig(_Section):
    mode: Literal["steer", "followup", "interrupt"] = "steer"
    cap: int = Field(20, ge=1, le=1000)
    debounce_ms: int = Field(500, ge=0, le=60000)  # the burst window for folding, never a wait


class GatewayConfig(_Section):
    max_concurrent_runs: int = Field(64, ge=1)
    lock_ttl_s: float = Field(30, ge=2)
    shutdown_grace_s: float = Field(30, ge=0)
    approval_timeout_s: float = Field(300, gt=0)
    run_timeout_s: float = Field(1800, gt=0)


class ToolLimitsConfig(_Section):
    processes: int = Field(256, ge=8)
    file_size_mb: int = Field(256, ge=1)
    memory_mb: int = Field(2048, ge=64)
    open_files: int = Field(1024, ge=32)


class SecurityConfig(_Section):
    allowed_paths: list[Path] | None = None  # None: [<workspace>, /tmp/botd]
    denied_paths: list[Path] = Field(
        default_factory=lambda: [Path("~/.ssh"), Path("~/.gnupg"), Path("/etc/shadow"), Path("/etc/passwd")]
    )
    tool_timeout_s: float = Field(120, gt=0)
    max_tool_output_bytes: int = Field(204800, ge=1024)
    env_allowlist: list[str] = Field(
        default_factory=lambda: ["PATH", "HOME", "USER", "LANG", "LC_ALL", "TERM", "SHELL", "TMPDIR", "TZ"]
    )
    cli_tools_file: Path | None = None
    sandbox: Literal["auto", "bwrap", "off"] = "auto"
    sandbox_network: bool = False
    tool_limits: ToolLimitsConfig = Field(default_factory=lambda: ToolLimitsConfig())
    # Keys the MACs on approvals and cron grants; unset: generated in <workspace>/.botd/daemon.key.
    secret: SecretStr | None = None

    @field_validator("secret", mode="before")
    @classmethod
    def _empty_secret(cls, value: Any) -> Any:
        return None if value == "" else value  # an empty variable from an env file means unset

    @field_validator("secret")
    @classmethod
    def _secret_length(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters (e.g. openssl rand -hex 32)")
        return value


class McpToolConfig(_Section):
    category: Literal["read", "write", "admin"] | None = None


class McpServerConfig(_Section):
    """One MCP server: ``command`` (stdio) or ``url`` (streamable HTTP, or SSE with ``transport: sse``)."""

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    transport: Literal["streamable_http", "sse"] = "streamable_http"  # for url only
    category: Literal["read", "write", "admin"] = "write"
    tools: dict[str, McpToolConfig] = Field(default_factory=dict)
    enabled_tools: list[str] | None = None
    disabled_tools: list[str] = Field(default_factory=list)
    enabled: bool = True
    timeout_s: float = Field(60, gt=0)
    startup_timeout_s: float = Field(30, gt=0)
    network: bool = True  # stdio: the server may reach the network from inside the tool sandbox

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("set exactly one of command (stdio) or url (HTTP)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return self


class McpConfig(_Section):
    servers: dict[str, McpServerConfig] = Field(default_factory=dict)

    @field_validator("servers")
    @classmethod
    def _names(cls, value: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*", name) or len(name) > 32:
                raise ValueError(
                    f"server name {name!r}: use letters, digits, '-' and single '_' (at most 32 characters)"
                )
        return value


class TargetConfig(_Section):
    channel: Literal["telegram", "slack", "console"] | None = None
    chat_id: str | None = None
    thread_id: str | None = None

    @field_validator("chat_id", "thread_id", mode="before")
    @classmethod
    def _as_string(cls, value: Any) -> Any:
        return None if value is None else str(value)


class HeartbeatConfig(_Section):
    enabled: bool = False
    every: str = "30m"
    active_hours: str | None = None
    timezone: str = "UTC"
    target: TargetConfig = Field(default_factory=TargetConfig)
    prompt: str | None = None

    @model_validator(mode="after")
    def _check(self) -> HeartbeatConfig:
        # One set of rules: the scheduler's own settings check every, timezone and
        # active_hours (the same code that later uses them); here they run at load time.
        from scheduler.settings import HeartbeatSettings

        HeartbeatSettings.from_config(self, enabled=False)
        return self


class SchedulerConfig(_Section):
    timezone: str = "UTC"
    catch_up: Literal["once", "skip"] = "once"

    @model_validator(mode="after")
    def _check(self) -> SchedulerConfig:
        from scheduler.settings import SchedulerSettings

        SchedulerSettings.from_config(self)
        return self


class LogConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "console"] = "json"


class AttachmentsConfig(_Section):
    """Files people send: fetched into the session's ``inbox/``, within these limits."""

    enabled: bool = True
    max_bytes: int = Field(20 * 1024 * 1024, ge=1)
    max_files: int = Field(10, ge=1, le=100)
    keep_days: float = Field(7, gt=0)


class BotdConfig(BaseSettings):
    """The whole configuration."""

    model_config = SettingsConfigDict(
        env_prefix="BOTD_", env_nested_delimiter="__", extra="forbid", case_sensitive=False
    )

    agent: AgentConfig = Field(default_factory=AgentConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    redis: RedisConfig = Field(default_factory=RedisConfig)
    http: HTTPConfig = Field(default_factory=HTTPConfig)
    telegram: TelegramConfig = Field(default_factory=TelegramConfig)
    slack: SlackConfig = Field(default_factory=SlackConfig)
    guard: GuardConfig = Field(default_factory=GuardConfig)
    queue: QueueConfig = Field(default_factory=QueueConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    heartbeat: HeartbeatConfig = Field(default_factory=HeartbeatConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    mcp: McpConfig = Field(default_factory=McpConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    attachments: AttachmentsConfig = Field(default_factory=AttachmentsConfig)
    # The file this config was read from (None: defaults and environment only).
    _source: Path | None = PrivateAttr(default=None)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # init carries the merged YAML + plain env names (see load_config); BOTD_ env wins.
        return (env_settings, init_settings)

    @property
    def source(self) -> Path | None:
        return self._source

    @source.setter
    def source(self, path: Path | None) -> None:
        self._source = path

    @property
    def workspace(self) -> Path:
        """``agent.workspace`` resolved (read several times a message: the lstat walk is
        done once per value, ``HOME`` and working directory)."""
        path = self.agent.workspace
        return _resolved(path, os.environ.get("HOME"), None if path.is_absolute() else os.getcwd())

    def allowed_paths(self) -> list[Path]:
        if self.security.allowed_paths is None:
            return [self.workspace, Path("/tmp/botd")]
        return [p.expanduser() for p in self.security.allowed_paths]

    def cli_tools_path(self) -> Path | None:
        path = self.security.cli_tools_file
        return path.expanduser() if path is not None else None


@functools.lru_cache(maxsize=16)
def _resolved(path: Path, _home: str | None, _cwd: str | None) -> Path:
    return path.expanduser().resolve()


def _string_list(value: Any) -> Any:
    if isinstance(value, str):
        value = [v for v in (s.strip() for s in value.split(",")) if v]
    if isinstance(value, list):
        return [str(v) for v in value]
    return value
