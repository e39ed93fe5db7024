"""SlackSettings: validation, secrets kept out of repr, built from the config model."""

from __future__ import annotations

import pytest

from bot.config import SlackConfig
from channels.slack.settings import SlackSettings


def test_missing_secrets_are_refused_with_the_key_named() -> None:
    with pytest.raises(ValueError, match="app_token is required"):
        SlackSettings(bot_token="xoxb-1", mode="socket")
    with pytest.raises(ValueError, match="signing_secret is required"):
        SlackSettings(bot_token="xoxb-1", mode="http")
    with pytest.raises(ValueError, match="bot_token is required"):
        SlackSettings(bot_token="", app_token="xapp-1")
    with pytest.raises(ValueError, match="mode must be"):
        SlackSettings(bot_token="xoxb-1", app_token="xapp-1", mode="carrier-pigeon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="events_path"):
        SlackSettings(bot_token="xoxb-1", signing_secret="s", mode="http", events_path="slack")
    with pytest.raises(ValueError, match="max_concurrent_intake"):
        SlackSettings(bot_token="xoxb-1", app_token="xapp-1", max_concurrent_intake=0)


def test_secrets_stay_out_of_repr() -> None:
    text = repr(SlackSettings(bot_token="xoxb-secret", app_token="xapp-secret", signing_secret="sig-secret"))
    assert "secret" not in text.replace("signing_secret", "")


def test_base_url_gets_its_trailing_slash() -> None:
    assert SlackSettings(bot_token="b", app_token="a").base_url == "https://slack.com/api/"
    assert SlackSettings(bot_token="b", app_token="a", api_base_url="http://127.0.0.1:9/api").base_url == (
        "http://127.0.0.1:9/api/"
    )


def test_from_config_unwraps_secrets_and_copies_the_section() -> None:
    config = SlackConfig(
        enabled=True,
        bot_token="xoxb-1",
        signing_secret="sig",
        mode="http",
        api_base_url="http://127.0.0.1:1/api/",
        events_path="/hooks/slack",
        allow_from=["U1", "U2"],
        channels=["C1"],
        require_mention=False,
    )
    settings = SlackSettings.from_config(config, preview_interval_s=0.5)
    assert settings.bot_token == "xoxb-1" and settings.signing_secret == "sig" and settings.app_token is None
    assert (settings.mode, settings.events_path, settings.require_mention) == ("http", "/hooks/slack", False)
    assert settings.allow_from == ("U1", "U2") and settings.channels == ("C1",)
    assert settings.preview_interval_s == 0.5


def test_web_api_logger_level_follows_the_configured_one() -> None:
    """slack_sdk formats its per-call debug lines whenever its logger's own level is NOTSET
    or DEBUG; the channel's logger carries the configured level so they are built only
    when they would be shown."""
    import logging

    from channels.slack.adapter import WEB_LOGGER, web_logger

    root = logging.getLogger()
    saved_root, saved_web = root.level, logging.getLogger(WEB_LOGGER).level
    try:
        root.setLevel(logging.INFO)
        assert web_logger().level == logging.INFO
        root.setLevel(logging.DEBUG)
        assert web_logger().level == logging.DEBUG
    finally:
        root.setLevel(saved_root)
        logging.getLogger(WEB_LOGGER).setLevel(saved_web)
