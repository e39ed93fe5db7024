from __future__ import annotations

from pathlib import Path

import pytest

from bot.app import build_model
from bot.cli import build_parser, event_loop_factory, main
from bot.config import BotdConfig, ConfigError


def test_config_accepted_before_and_after_the_subcommand() -> None:
    parser = build_parser()
    assert parser.parse_args(["--config", "a.yaml", "run"]).config == "a.yaml"
    assert parser.parse_args(["run", "--config", "b.yaml"]).config == "b.yaml"
    assert parser.parse_args(["cron", "add", "--in", "20m", "--channel", "slack", "--chat-id", "C1",
                              "--prompt", "hi", "--config", "c.yaml"]).config == "c.yaml"
    assert not hasattr(parser.parse_args(["run"]), "config")


def test_cron_add_needs_exactly_one_schedule() -> None:
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["cron", "add", "--in", "1m", "--every", "1h", "--channel", "slack",
                           "--chat-id", "C", "--prompt", "p"])


def test_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "botd.yaml"
    path.write_text("queue: {cap: 0}")
    assert main(["run", "--config", str(path)]) == 2
    assert "queue.cap" in capsys.readouterr().err


def test_missing_api_key_without_base_url_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="llm.api_key"):
        build_model(BotdConfig())


async def test_bad_cli_tools_file_is_a_config_error(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    from bot.app import App
    from bot.store.connection import open_redis

    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - name: x\n    description: d\n    args: ['{{nope}}']\n")
    cfg = BotdConfig(
        agent={"workspace": str(tmp_path / "ws")},
        redis={"url": redis_url, "prefix": redis_prefix},
        security={"cli_tools_file": str(tools)},
        llm={"api_key": "test"},
    )
    handle = await open_redis(cfg.redis, cfg.workspace)
    try:
        with pytest.raises(ConfigError, match="security.cli_tools_file"):
            App(cfg, handle, build_model(cfg), {})
    finally:
        await handle.close()


def test_the_event_loop_is_uvloop_unless_asked_otherwise() -> None:
    import uvloop

    assert event_loop_factory("auto") is uvloop.new_event_loop
    assert event_loop_factory("") is uvloop.new_event_loop
    assert event_loop_factory(" UVLOOP ") is uvloop.new_event_loop
    assert event_loop_factory("asyncio") is None
    with pytest.raises(ValueError, match="auto, uvloop or asyncio"):
        event_loop_factory("trio")


def test_an_unknown_event_loop_choice_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "botd.yaml"
    config.write_text("llm: {model: gpt-4o-mini}\n", encoding="utf-8")
    monkeypatch.setenv("BOTD_EVENT_LOOP", "fastest")
    assert main(["sessions", "list", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "BOTD_EVENT_LOOP must be auto, uvloop or asyncio" in err
