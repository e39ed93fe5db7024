"""Markdown -> Slack mrkdwn rendering and splitting into messages."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from channels.slack.format import SLACK_TEXT_LIMIT, format_parts, to_mrkdwn

# Any "<" in rendered output must open a link the renderer made.
_LIVE_MARKUP = re.compile(r"<(?!(?:https?://|mailto:)[^<>\s|]+(?:\|[^<>]*)?>)")
_MENTION = re.compile(r"<[!@#]")


def _balanced_fences(part: str) -> bool:
    return part.count("```") % 2 == 0


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("**bold**", "*bold*"),
        ("__bold__", "*bold*"),
        ("*it*", "_it_"),
        ("~~gone~~", "~gone~"),
        ("`x = 1`", "`x = 1`"),
        ("**bold _and it_**", "*bold _and it_*"),
        ("[docs](https://example.com/a?b=1&c=2)", "<https://example.com/a?b=1&amp;c=2|docs>"),
        ("<https://example.com>", "<https://example.com>"),
        ("[mail](mailto:a@example.com)", "<mailto:a@example.com|mail>"),
        ("# Title", "*Title*"),
        ("## Title with **bold**", "*Title with bold*"),
        ("- a\n- b", "• a\n• b"),
        ("1. a\n2. b", "1. a\n2. b"),
        ("3. a\n4. b", "3. a\n4. b"),
        ("- a\n  - b", "• a\n    • b"),
        ("> quoted\n> more", "> quoted\n> more"),
        ("a & b < c > d", "a &amp; b &lt; c &gt; d"),
        ("first\nsecond", "first\nsecond"),
        ("para one\n\npara two", "para one\n\npara two"),
        ("---", "──────────"),
    ],
)
def test_renders_markdown_as_mrkdwn(markdown: str, expected: str) -> None:
    assert to_mrkdwn(markdown) == expected


def test_fenced_code_keeps_content_escaped_and_drops_language() -> None:
    out = to_mrkdwn("```python\nif a < b and c & d:\n    pass\n```")
    assert out == "```\nif a &lt; b and c &amp; d:\n    pass\n```"


def test_styles_do_not_span_lines() -> None:
    # Slack cannot carry bold over a newline: each line closes and reopens it.
    assert to_mrkdwn("**one\ntwo**") == "*one*\n*two*"


def test_table_becomes_aligned_code_block() -> None:
    out = to_mrkdwn("| name | n |\n|---|---|\n| a | 10 |")
    assert out == "```\nname | n\n-----+---\na    | 10\n```"


@pytest.mark.parametrize(
    "evil",
    [
        "<!channel>",
        "<!here>",
        "<!everyone>",
        "<!subteam^S123|@team>",
        "<@U123ABC>",
        "<#C123|general>",
        "ping <!channel> now",
        "[click](<!channel>)",
        "[x](javascript:alert(1))",
        "`<!here>`",
        "```\n<!channel>\n```",
        "<https://ok.example|<!channel>>",
        "**<@U1>**",
        "> <!everyone>",
    ],
)
def test_mentions_written_by_the_model_are_inert(evil: str) -> None:
    for part in format_parts(evil):
        assert not _MENTION.search(part), part
        assert not _LIVE_MARKUP.search(part), part


def test_unsafe_link_is_shown_as_text() -> None:
    assert to_mrkdwn("[x](ftp://host/file)") == "x"
    assert to_mrkdwn("[rel](/path)") == "rel"
    assert "<" not in to_mrkdwn("[x](javascript:alert(1))")


def test_model_backticks_cannot_open_a_fence() -> None:
    out = to_mrkdwn("look: \\`\\`\\` not a fence")
    assert "```" not in out


def test_empty_input_gives_no_parts() -> None:
    assert format_parts("") == []
    assert format_parts("   \n\n ") == []


def test_short_text_is_one_part() -> None:
    assert format_parts("hello **world**") == ["hello *world*"]


def test_long_text_splits_between_paragraphs() -> None:
    paragraphs = [f"Paragraph {i}. " + "word " * 150 for i in range(12)]
    parts = format_parts("\n\n".join(p.strip() for p in paragraphs))
    assert len(parts) > 1
    assert all(len(p) <= SLACK_TEXT_LIMIT for p in parts)
    for part in parts:  # each part starts a paragraph
        assert part.startswith("Paragraph ")
    assert "".join(parts).count("Paragraph") == 12


def test_oversize_paragraph_splits_after_a_sentence_and_keeps_bold_balanced() -> None:
    sentence = "**This sentence is bold and it goes on for a while with many words.** "
    text = sentence * 120
    parts = format_parts(text, 1000)
    assert len(parts) > 1
    for part in parts:
        assert len(part) <= 1000
        assert part.startswith("*") and part.endswith("*")
        assert part.count("*") % 2 == 0


def test_oversize_line_without_sentences_splits_between_words() -> None:
    parts = format_parts("_" + "alpha " * 400 + "omega_", 300)
    assert len(parts) > 1
    for part in parts:
        assert len(part) <= 300
        assert part.startswith("_") and part.endswith("_")
        assert not part.startswith("_ ") and not part.endswith(" _")
    words = " ".join(p.strip("_") for p in parts).split()
    assert words[0] == "alpha" and words[-1] == "omega" and len(words) == 401


def test_code_block_split_closes_and_reopens_the_fence() -> None:
    code = "\n".join(f"line {i:04d} = compute(a < b & c)" for i in range(600))
    parts = format_parts(f"Intro.\n\n```\n{code}\n```\n\nOutro.")
    assert len(parts) > 2
    code_parts = [p for p in parts if "```" in p]
    for part in parts:
        assert len(part) <= SLACK_TEXT_LIMIT
        assert _balanced_fences(part)
    for part in code_parts:
        body = part[part.index("```") : part.rindex("```") + 3]
        assert body.startswith("```\n") and body.endswith("\n```")
    lines = [ln for p in code_parts for ln in p.split("\n") if ln.startswith("line ")]
    assert len(lines) == 600 and lines[0].startswith("line 0000") and lines[-1].startswith("line 0599")


def test_a_single_huge_word_is_cut_hard_without_breaking_escapes() -> None:
    parts = format_parts("&" * 3000, 500)
    assert all(len(p) <= 500 for p in parts)
    assert "".join(parts) == "&amp;" * 3000


def test_a_huge_code_line_is_cut_into_lines_within_the_fence() -> None:
    parts = format_parts("```\n" + "x<" * 5000 + "\n```", 1000)
    assert len(parts) > 1
    for part in parts:
        assert len(part) <= 1000 and part.startswith("```\n") and part.endswith("\n```")


def test_too_small_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        format_parts("hello", 10)


# -- properties -----------------------------------------------------------------------------

_PIECES = st.sampled_from(
    [
        "**",
        "*",
        "_",
        "__",
        "~~",
        "`",
        "```",
        "\n",
        "\n\n",
        " ",
        "- ",
        "1. ",
        "> ",
        "# ",
        "[",
        "](",
        ")",
        "<",
        ">",
        "&",
        "|",
        "<!channel>",
        "<!here>",
        "<@U123>",
        "<#C9|x>",
        "<!subteam^S1>",
        "http://a.b/c",
        "mailto:x@y.z",
        "word",
        "Sentence. ",
        "ü",
        "😀",
        "\t",
        "    ",
        "| a | b |\n|---|---|\n",
        "\\",
        "<!",
    ]
)
_MODEL_TEXT = st.lists(_PIECES, max_size=80).map("".join) | st.text(max_size=300)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_MODEL_TEXT, limit=st.sampled_from([64, 100, 250, SLACK_TEXT_LIMIT]))
def test_parts_fit_have_balanced_fences_and_no_live_mentions(text: str, limit: int) -> None:
    parts = format_parts(text, limit)
    for part in parts:
        assert 0 < len(part) <= limit
        assert _balanced_fences(part), part
        assert not _MENTION.search(part), part
        assert not _LIVE_MARKUP.search(part), part


@settings(max_examples=60, deadline=None)
@given(words=st.lists(st.text(alphabet="abcdefgh ", min_size=1, max_size=12), min_size=1, max_size=400))
def test_plain_words_survive_splitting(words: list[str]) -> None:
    text = " ".join(w.strip() or "x" for w in words)
    parts = format_parts(text, 80)
    assert " ".join(" ".join(parts).split()) == " ".join(text.split())


# Plain one-line text skips the Markdown parse: it must render exactly as the parse would.
_PLAINISH = st.text(
    alphabet=st.sampled_from([*"aZ\u00e9\u4e2d1 ,.;:?!'\"%$@/()+=-_*`~#>[]<&|\\\t\n", "\u00a0", "\u200b"]),
    max_size=40,
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_PLAINISH)
def test_plain_text_shortcut_renders_like_the_parser(text: str) -> None:
    from channels.slack.format import render_blocks
    from channels.slack.split import split_blocks

    assert format_parts(text) == split_blocks(render_blocks(text), SLACK_TEXT_LIMIT)


@pytest.mark.parametrize(
    "text", ["Sure, done!", "plain notice", "Ready in 5 minutes (maybe 10).", "state-of-the-art: 100% @here"]
)
def test_plain_sentences_are_sent_as_they_are(text: str) -> None:
    assert format_parts(text) == [text]


def test_plain_text_over_the_limit_is_still_split() -> None:
    text = "word " * 2000 + "end"
    parts = format_parts(text)
    assert len(parts) > 1
    assert all(len(part) <= SLACK_TEXT_LIMIT for part in parts)
