"""Inbound Slack text: mention stripping and markup resolution."""

from __future__ import annotations

import pytest

from channels.slack.text import strip_mention, to_plain


@pytest.mark.parametrize(
    ("text", "expected", "mentioned"),
    [
        ("<@UBOT> hello", "hello", True),
        ("<@UBOT|botd> hello", "hello", True),
        ("hey <@UBOT> do this", "hey do this", True),
        ("hello <@UBOT>", "hello", True),
        ("<@UOTHER> hello", "<@UOTHER> hello", False),
        ("no mention", "no mention", False),
        ("<@UBOT>", "", True),
        ("<@UBOTX> hi", "<@UBOTX> hi", False),
    ],
)
def test_strip_mention(text: str, expected: str, mentioned: bool) -> None:
    assert strip_mention(text, "UBOT") == (expected, mentioned)


@pytest.mark.parametrize(
    ("slack", "plain"),
    [
        ("a &amp; b &lt;c&gt;", "a & b <c>"),
        ("see <https://example.com>", "see https://example.com"),
        ("see <https://example.com|example.com>", "see https://example.com"),
        ("see <https://example.com/x|the docs>", "see the docs (https://example.com/x)"),
        ("mail <mailto:a@b.c|a@b.c>", "mail mailto:a@b.c"),
        ("ask <@U123>", "ask @U123"),
        ("ask <@U123|ann>", "ask @ann"),
        ("in <#C1|general>", "in #general"),
        ("in <#C1>", "in #C1"),
        ("<!here> and <!channel> and <!everyone>", "@here and @channel and @everyone"),
        ("<!subteam^S1|@devs>", "@devs"),
        ("<!date^1392734382^{date}|Feb 18>", "Feb 18"),
        ("&amp;lt;", "&lt;"),
    ],
)
def test_to_plain(slack: str, plain: str) -> None:
    assert to_plain(slack) == plain
