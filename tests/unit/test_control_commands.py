"""Which texts are control commands, and what they carry."""

from __future__ import annotations

import re

import pytest

from bot.gateway.control import COMMANDS, HELP_TEXT, Command, parse_command


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ("/compact", Command("compact")),
        ("/compact@botd_bot", Command("compact")),
        ("/compact   keep the decisions about the deploy  ", Command("compact", "keep the decisions about the deploy")),
        ("/compact focus\non two lines", Command("compact", "focus\non two lines")),
        ("/model", Command("model")),
        ("/MODEL gpt-4o", Command("model", "gpt-4o")),
        ("/model@botd_bot claude-3.5", Command("model", "claude-3.5")),
        ("/usage", Command("usage")),
        ("/status", Command("status")),
        ("/approve abc", Command("approve", "abc")),
    ],
)
def test_commands_and_their_arguments(text: str, command: Command) -> None:
    assert parse_command(text) == command


@pytest.mark.parametrize(
    "text",
    [
        "/model gpt-4o please",  # one word only: anything else is a message
        "/usage now",
        "/stop it",
        "/approve",
        "/compact " + "x" * 501,
        "please /compact",
        "/compacting",
    ],
)
def test_texts_that_are_messages(text: str) -> None:
    assert parse_command(text) is None


def test_help_and_the_command_menu_list_the_new_commands() -> None:
    names = [name for name, _ in COMMANDS]
    for name in ("compact", "model", "usage"):
        assert name in names and f"/{name}" in HELP_TEXT
    # Telegram accepts 1-32 lowercase letters, digits and underscores, and a description.
    assert all(re.fullmatch(r"[a-z0-9_]{1,32}", name) and 0 < len(text) <= 256 for name, text in COMMANDS)
