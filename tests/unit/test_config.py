from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import BotdConfig, ConfigError
from bot.config_file import load_config


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("BOTD_") or name in {"OPENAI_API_KEY", "OPENAI_BASE_URL", "REDIS_URL",
                                               "TELEGRAM_BOT_TOKEN", "SLACK_BOT_TOKEN"}:
            monkeypatch.delenv(name, raising=False)


def test_defaults_match_the_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config()
    assert cfg.agent.max_iterations == 20 and cfg.agent.history_turns == 50
    assert cfg.llm.model == "gpt-4o-mini" and cfg.llm.context_window == 128000
    assert cfg.redis.url is None and cfg.redis.prefix == "botd"
    assert (cfg.http.host, cfg.http.port) == ("127.0.0.1", 8080)
    assert cfg.telegram.mode == "polling" and cfg.telegram.dm_policy == "allowlist"
    assert cfg.slack.mode == "socket" and cfg.slack.events_path == "/slack/events"
    assert cfg.queue.mode == "steer" and cfg.queue.cap == 20 and cfg.queue.debounce_ms == 500
    assert cfg.guard.action == "warn"
    assert cfg.heartbeat.every == "30m" and cfg.scheduler.catch_up == "once"
    assert cfg.allowed_paths() == [cfg.workspace, Path("/tmp/botd")]


def test_the_workspace_follows_its_value_home_and_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resolved workspace is kept, but never past a change to what it was resolved from."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.setenv("HOME", str(tmp_path / "one"))
    cfg = BotdConfig()
    assert cfg.workspace == tmp_path / "one" / ".botd" / "workspace"
    monkeypatch.setenv("HOME", str(tmp_path / "two"))
    assert cfg.workspace == tmp_path / "two" / ".botd" / "workspace"
    cfg.agent.workspace = Path("ws")
    monkeypatch.chdir(tmp_path / "real")
    assert cfg.workspace == tmp_path / "real" / "ws"
    monkeypatch.chdir(tmp_path)
    assert cfg.workspace == tmp_path / "ws"
    cfg.agent.workspace = tmp_path / "link" / "ws"
    assert cfg.workspace == tmp_path / "real" / "ws"


def test_yaml_then_plain_env_then_botd_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "botd.yaml"
    path.write_text("llm: {model: from-file, api_key: file-key}\nredis: {url: redis://file:6379/0}\n")
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    monkeypatch.setenv("BOTD_LLM__MODEL", "from-env")
    monkeypatch.setenv("BOTD_TELEGRAM__ALLOW_FROM", '["1", 2]')
    cfg = load_config(path)
    assert cfg.llm.model == "from-env"
    assert cfg.llm.api_key is not None and cfg.llm.api_key.get_secret_value() == "env-key"
    assert cfg.redis.url == "redis://file:6379/0"
    assert cfg.telegram.allow_from == ["1", "2"]


def test_botd_config_env_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "other.yaml"
    path.write_text("agent: {id: other}\n")
    monkeypatch.setenv("BOTD_CONFIG", str(path))
    assert load_config().agent.id == "other"


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("llm: {max_retries: lots}", "llm.max_retries"),
        ("queue: {mode: sideways}", "queue.mode"),
        ("heartbeat: {every: 1m}", "heartbeat.every"),
        ("heartbeat: {timezone: Mars/Olympus}", "heartbeat.timezone"),
        ("scheduler: {timezone: Nowhere}", "scheduler.timezone"),
        ("agent: {colour: blue}", "agent.colour"),
        ("telegram: {enabled: true}", "telegram"),
        ("telegram: {enabled: true, token: '1:x', mode: webhook}", "telegram.webhook_url"),
        ("slack: {enabled: true, bot_token: x, mode: http}", "slack"),
        ("slack: {dm_policy: everyone}", "slack.dm_policy"),
        ("telegram: {dm_policy: strangers}", "telegram.dm_policy"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, yaml_text: str, key: str) -> None:
    path = tmp_path / "botd.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert key in str(info.value)


def test_pairing_is_a_dm_policy_of_both_platforms(tmp_path: Path) -> None:
    path = tmp_path / "botd.yaml"
    path.write_text("telegram: {dm_policy: pairing}\nslack: {dm_policy: pairing}\n")
    cfg = load_config(path)
    assert (cfg.telegram.dm_policy, cfg.slack.dm_policy) == ("pairing", "pairing")


def test_unknown_guard_action_falls_back_to_warn(tmp_path: Path) -> None:
    path = tmp_path / "botd.yaml"
    path.write_text("guard: {action: shout}")
    assert load_config(path).guard.action == "warn"


def test_secrets_are_not_echoed_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "botd.yaml"
    path.write_text("llm: {api_key: sk-supersecretvalue, max_retries: -1}")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "supersecret" not in str(info.value)
    assert "sk-" not in repr(load_config_safe(tmp_path))


def load_config_safe(tmp_path: Path) -> object:
    path = tmp_path / "ok.yaml"
    path.write_text("llm: {api_key: sk-supersecretvalue}")
    return load_config(path)


def test_not_yaml_and_not_a_mapping(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("llm: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- a list")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
