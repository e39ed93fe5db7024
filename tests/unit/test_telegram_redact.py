"""The bot token never reaches logs, whichever library writes them."""

from __future__ import annotations

import logging

import pytest

from channels.telegram.redact import REDACTED, TokenRedactor, scrub

TOKEN = "123456789:AAFakeTokenForTestsOnly_abcdefghijkl"


def test_scrub_replaces_token_shapes_inside_urls() -> None:
    assert scrub(f"POST https://api.telegram.org/bot{TOKEN}/getMe") == f"POST https://api.telegram.org/bot{REDACTED}/getMe"
    assert scrub("12:30 and 2024:short") == "12:30 and 2024:short"


def test_filter_rewrites_library_records(caplog: pytest.LogCaptureFixture) -> None:
    redactor = TokenRedactor(TOKEN)
    redactor.install()
    try:
        caplog.set_level(logging.INFO)
        logging.getLogger("httpx").info("HTTP Request: %s %s", "POST", f"http://x/bot{TOKEN}/sendMessage")
        logging.getLogger("telegram.Bot").info("token %s", TOKEN)
    finally:
        redactor.uninstall()
    assert TOKEN not in caplog.text
    assert caplog.text.count(REDACTED) == 2
    logging.getLogger("httpx").info("after uninstall %s", "plain")
