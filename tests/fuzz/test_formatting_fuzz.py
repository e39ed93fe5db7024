"""Formatters and splitters on hostile Unicode: emoji (UTF-16 pairs), ZWJ sequences, RTL and bidi
controls, NULs, combining marks, very long words, and Markdown/mrkdwn/HTML look-alikes."""

from __future__ import annotations

import re
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from channels.chunking import split_text, utf16_len
from channels.slack.format import SLACK_TEXT_LIMIT, format_parts, preview_part, to_mrkdwn
from channels.telegram.format import html_to_plain, markdown_to_html, render_parts, render_preview
from tests.fakes.telegram_html import TelegramHTMLError, parse_telegram_html
from tests.fuzz.strategies import (
    HOSTILE_PIECES,
    hostile_text,
    markdown_text,
    utf16_units,
    with_lone_surrogates,
)

TELEGRAM_LIMIT = 4096


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


any_text = st.one_of(hostile_text, markdown_text)
# What the model may send: the formatters take lone surrogates too (they count as one UTF-16 unit).
model_text = st.one_of(hostile_text, markdown_text, with_lone_surrogates)

# Text without Markdown syntax: what the reader sees must be exactly what was written.
_PLAIN_PIECES = [p for p in HOSTILE_PIECES if not re.search(r"[<>&`*_~|#\[\]()!.?:/\\\x00\-]", p)]
plain_text = st.lists(
    st.one_of(
        st.sampled_from(_PLAIN_PIECES),
        st.text(st.characters(categories=("L", "M", "N", "So", "Zs")), max_size=30),
    ),
    max_size=60,
).map("".join)


def _squash(text: str) -> str:
    return "".join(text.split())


def _telegram_valid(part: str) -> str:
    """The visible text of a part that Telegram's HTML parser accepts (lone surrogates, which the
    fake's error offsets cannot encode, are checked as U+FFFD)."""
    part = re.sub("[\ud800-\udfff]", "\ufffd", part)
    try:
        return parse_telegram_html(part)
    except TelegramHTMLError as exc:
        raise AssertionError(f"{exc}: {part!r}") from exc


# -- channels.chunking ------------------------------------------------------------------------


@fuzz(400)
@given(text=any_text, limit=st.integers(min_value=1, max_value=120))
def test_split_text_rejoins_exactly_by_characters(text: str, limit: int) -> None:
    parts = split_text(text, limit)
    assert "".join(parts) == text
    assert all(0 < len(p) <= limit for p in parts)


@fuzz(400)
@given(text=any_text, limit=st.integers(min_value=1, max_value=120))
def test_split_text_rejoins_exactly_by_utf16_units(text: str, limit: int) -> None:
    if limit == 1 and any(ord(c) > 0xFFFF for c in text):
        with pytest.raises(ValueError, match="alone exceeds"):
            split_text(text, limit, utf16_len)
        return
    parts = split_text(text, limit, utf16_len)
    assert "".join(parts) == text
    assert all(0 < utf16_len(p) <= limit for p in parts)


@fuzz(150)
@given(text=any_text, limit=st.integers(min_value=2, max_value=60))
def test_split_text_keeps_emoji_sequences_whole_when_it_can(text: str, limit: int) -> None:
    """A hard cut never lands right after a ZWJ or before a combining mark / variation selector,
    unless the part could hold nothing else."""
    parts = split_text(text, limit)
    for part, following in pairwise(parts):
        if len(part) > 1:
            assert not part.endswith("\u200d"), (part, following)
            assert following[0] not in "\u200d\ufe0f\ufe0e", (part, following)


@pytest.mark.parametrize("limit", [0, -1])
def test_split_text_refuses_a_non_positive_limit(limit: int) -> None:
    with pytest.raises(ValueError):
        split_text("abc", limit)


@fuzz(100)
@given(text=with_lone_surrogates, limit=st.integers(min_value=1, max_value=40))
def test_split_text_by_characters_takes_lone_surrogates(text: str, limit: int) -> None:
    # Python strings may hold lone surrogates (e.g. from a JSON "\ud800" escape).
    assert "".join(split_text(text, limit)) == text


# -- Telegram: Markdown -> HTML -> parts -------------------------------------------------------


@fuzz(250)
@given(md=model_text, limit=st.sampled_from([256, 300, 512, 1000, TELEGRAM_LIMIT]))
def test_telegram_parts_fit_parse_and_lose_nothing(md: str, limit: int) -> None:
    whole = markdown_to_html(md)
    parts = render_parts(md, limit)
    for part in parts:
        assert 0 < utf16_units(part) <= limit, part
        assert _telegram_valid(part).strip(), part
    joined = "".join(html_to_plain(p) for p in parts)
    assert _squash(joined) == _squash(html_to_plain(whole))


@fuzz(150)
@given(text=plain_text, limit=st.sampled_from([256, 400, TELEGRAM_LIMIT]))
def test_telegram_plain_text_reaches_the_reader_unchanged(text: str, limit: int) -> None:
    parts = render_parts(text, limit)
    assert _squash("".join(_telegram_valid(p) for p in parts)) == _squash(text)


@fuzz(40)
@given(
    word=st.sampled_from(["x", "😀", "👨‍👩‍👧‍👦", "e\u0301", "ש", "\u202e", "&", "<"]),
    count=st.integers(min_value=1000, max_value=5000),
    wrap=st.sampled_from(["{}", "**{}**", "`{}`", "```\n{}\n```", "> {}", "[{}](https://example.com)"]),
)
def test_telegram_one_huge_word_is_split_within_the_limit(word: str, count: int, wrap: str) -> None:
    md = wrap.format(word * count)
    parts = render_parts(md, TELEGRAM_LIMIT)
    assert parts
    for part in parts:
        assert utf16_len(part) <= TELEGRAM_LIMIT
        _telegram_valid(part)
    joined = "".join(html_to_plain(p) for p in parts)
    assert _squash(joined) == _squash(html_to_plain(markdown_to_html(md)))


@fuzz(100)
@given(md=model_text, limit=st.sampled_from([258, 600, TELEGRAM_LIMIT]))
def test_telegram_preview_fits_and_parses(md: str, limit: int) -> None:
    preview = render_preview(md, limit)
    assert utf16_units(preview) <= limit
    if preview:
        _telegram_valid(preview)


# -- Slack: Markdown -> mrkdwn -> parts --------------------------------------------------------

# After rendering, the only "<…>" are links the renderer made; nothing can ping anyone.
_LIVE_MENTION = re.compile(r"<\s*[!@#]|<(?!(?:https?://|mailto:)[^<>\s|]+(?:\|[^<>]*)?>)")


def _slack_safe(part: str) -> None:
    assert not _LIVE_MENTION.search(part), part
    assert part.count("```") % 2 == 0, part


@fuzz(250)
@given(md=model_text, limit=st.sampled_from([64, 100, 333, 1000, SLACK_TEXT_LIMIT]))
def test_slack_parts_fit_balance_fences_and_ping_nobody(md: str, limit: int) -> None:
    parts = format_parts(md, limit)
    for part in parts:
        assert 0 < len(part) <= limit, part
        assert part.strip()
        _slack_safe(part)
    _slack_safe(to_mrkdwn(md))


@fuzz(100)
@given(
    mention=st.sampled_from(["<!channel>", "<!here>", "<!everyone>", "<@U0123ABC>", "<@W1|boss>", "<!subteam^S1>",
                             "<#C123>", "&lt;!channel&gt;", "<!channel|channel>", "<\n!here>", "< !here >"]),
    around=st.sampled_from(["{}", "**{}**", "`{}`", "```\n{}\n```", "> {}", "[{}](https://e.com)", "- {}",
                            "[x](https://e.com/{})", "<{}>", "| {} | b |\n|---|---|\n| 1 | 2 |"]),
    filler=st.text(max_size=30),
)
def test_slack_mentions_from_model_text_stay_inert(mention: str, around: str, filler: str) -> None:
    md = filler + around.format(mention) + filler
    for part in [*format_parts(md, 64), to_mrkdwn(md)]:
        _slack_safe(part)


@fuzz(40)
@given(
    word=st.sampled_from(["x", "😀", "👨‍👩‍👧‍👦", "e\u0301", "&", "<", "`", "*"]),
    count=st.integers(min_value=800, max_value=5000),
    wrap=st.sampled_from(["{}", "**{}**", "`{}`", "```\n{}\n```", "> {}", "- {}"]),
)
def test_slack_one_huge_word_is_split_within_the_limit(word: str, count: int, wrap: str) -> None:
    parts = format_parts(wrap.format(word * count), SLACK_TEXT_LIMIT)
    assert parts
    for part in parts:
        assert len(part) <= SLACK_TEXT_LIMIT
        _slack_safe(part)


@fuzz(100)
@given(md=model_text, limit=st.sampled_from([66, 500, SLACK_TEXT_LIMIT]))
def test_slack_preview_fits(md: str, limit: int) -> None:
    preview = preview_part(md, limit)
    if preview is not None:
        assert len(preview) <= limit
        _slack_safe(preview)


@fuzz(300)
@given(model_text)
def test_telegram_one_message_answers_skip_the_split_with_the_same_parts(text: str) -> None:
    # render_parts takes a short cut when the markup fits one message; the result must be
    # exactly what the markup-aware split gives.
    from channels.telegram.format import MAX_URL_LEN
    from channels.telegram.html_split import split_html

    markup = markdown_to_html(text, max_url_len=min(MAX_URL_LEN, (TELEGRAM_LIMIT - 128) // 2))
    expected = [p for p in split_html(markup, TELEGRAM_LIMIT) if html_to_plain(p).strip()]
    assert render_parts(text, TELEGRAM_LIMIT) == expected


@pytest.mark.parametrize("md", ["[a](\ud83d\ude00)", "x \ud83d y", "**b \udc00**", "`\ud83d`", "\ud83d\ude00 plain"])
def test_model_text_with_surrogates_renders_on_both_platforms(md: str) -> None:
    """JSON escapes decoded one by one leave surrogates in model text: a pair becomes its
    character, a lone one U+FFFD, and nothing a platform cannot encode goes out."""
    for part in [*format_parts(md), *render_parts(md, 4096), to_mrkdwn(md), markdown_to_html(md)]:
        part.encode("utf-8")  # raises on any surrogate left
    assert "😀" in "".join(format_parts("\ud83d\ude00 plain"))
