"""Config search, token shapes, the init template and the sessions table (no network)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from bot.cli import build_parser
from bot.cli_commands import format_session_table
from bot.config import BotdConfig
from bot.config_file import load_config
from bot.init_wizard import Answers, check_rendered, render_config, write_private
from bot.probes import slack_token_problems, telegram_token_problem
from bot.store.session_info import SessionInfo


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("BOTD_", "OPENAI_", "TELEGRAM_", "SLACK_")) or name == "REDIS_URL":
            monkeypatch.delenv(name, raising=False)


def home() -> Path:
    return Path(os.environ["HOME"])


def test_search_order_explicit_env_local_home_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_config().source is None
    assert load_config().workspace == home() / ".botd" / "workspace"
    (home() / ".botd").mkdir()
    (home() / ".botd" / "botd.yaml").write_text("agent: {id: home}\n")
    assert load_config().agent.id == "home" and load_config().source == home() / ".botd" / "botd.yaml"
    (tmp_path / "botd.yaml").write_text("agent: {id: local}\n")
    assert load_config().agent.id == "local"
    (tmp_path / "env.yaml").write_text("agent: {id: env}\n")
    monkeypatch.setenv("BOTD_CONFIG", str(tmp_path / "env.yaml"))
    assert load_config().agent.id == "env"
    (tmp_path / "flag.yaml").write_text("agent: {id: flag}\n")
    assert load_config(tmp_path / "flag.yaml").agent.id == "flag"


def test_paths_in_a_file_are_relative_to_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "botd.yaml").write_text("agent: {workspace: ws}\nsecurity: {cli_tools_file: tools.yaml}\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(conf / "botd.yaml")
    assert cfg.workspace == conf / "ws"
    assert cfg.cli_tools_path() == conf / "tools.yaml"
    (conf / "home.yaml").write_text("agent: {workspace: ~/w}\n")
    assert load_config(conf / "home.yaml").workspace == home() / "w"


def test_a_config_directory_is_a_config_error(tmp_path: Path) -> None:
    from bot.config import ConfigError

    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


@pytest.mark.parametrize(
    ("token", "ok"),
    [
        ("123456789:AAFakeTokenForTestsOnly_abcdefghijk", True),
        ("123456789:AAFakeTokenForTestsOnly_abcdefghijkl", False),  # 36 characters
        ("123456789:AAFakeToken ForTestsOnly_abcdefghij", False),
        ("abc:AAFakeTokenForTestsOnly_abcdefghijk", False),
        ("", False),
    ],
)
def test_telegram_token_shape(token: str, ok: bool) -> None:
    problem = telegram_token_problem(token)
    assert (problem is None) is ok
    if problem is not None:
        assert token not in problem.detail + problem.fix or not token


def test_slack_token_shapes() -> None:
    assert slack_token_problems("xoxb-1", "xapp-1", socket_mode=True) == []
    assert slack_token_problems("xoxb-1", None, socket_mode=False) == []
    (swapped,) = slack_token_problems("xapp-1", "xoxb-1", socket_mode=True)
    assert "swapped" in swapped.detail
    (missing,) = slack_token_problems("xoxb-1", None, socket_mode=True)
    assert "slack.app_token is not set" in missing.detail and "connections:write" in missing.fix
    details = [p.detail for p in slack_token_problems(None, "nope", socket_mode=True)]
    assert details == ["slack.bot_token is not set", "slack.app_token does not start with xapp-"]


def test_init_template_loads_with_every_answer_and_none(tmp_path: Path) -> None:
    full = Answers(llm_base_url="http://h/v1", llm_api_key='k"ey\n', telegram_token="1:x",
                   slack_bot_token="xoxb-1", slack_mode="http", slack_signing_secret="s", dm_policy="allowlist",
                   allow_from=["42", "@me"])
    for answers in (Answers(), full):
        text = render_config(answers)
        check_rendered(text)
        data = yaml.safe_load(text)
        assert data["telegram"]["dm_policy"] == answers.dm_policy
    cfg = BotdConfig(**yaml.safe_load(render_config(full)))
    assert cfg.llm.api_key is not None and cfg.llm.api_key.get_secret_value() == 'k"ey\n'
    assert cfg.telegram.allow_from == ["42", "@me"] and cfg.slack.mode == "http"
    path = tmp_path / "d" / "botd.yaml"
    write_private(path, "x: 1\n")
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert [p.name for p in path.parent.iterdir()] == ["botd.yaml"]


def test_session_table_in_local_time() -> None:
    assert format_session_table([]) == "No sessions."
    table = format_session_table([SessionInfo(session_key="agent:main:telegram:dm:42", exists=True,
                                              message_count=3, last_activity=0.0)])
    header, row = table.splitlines()
    assert header.split() == ["LAST", "ACTIVITY", "MESSAGES", "TOKENS", "SESSION"]
    assert row.endswith("agent:main:telegram:dm:42") and " 3 " in row and "19" in row[:4]


def test_help_names_every_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["cron", "add", "--help"])
    text = capsys.readouterr().out
    assert "IN_" not in text and "--in DURATION" in text and "--chat-id ID" in text


async def test_an_unreachable_telegram_never_shows_the_token() -> None:
    from bot.probes import probe_telegram

    token = "123456789:" + "A" * 35
    for base in ("http://127.0.0.1:9/bot", "ftp://nowhere/bot"):
        probe = await probe_telegram(token, base, timeout_s=2)
        assert not probe.ok and token not in probe.detail and "A" * 35 not in probe.detail
