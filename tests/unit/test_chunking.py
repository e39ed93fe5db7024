"""channels.chunking: boundary preference and the exact split properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.chunking import find_break, max_fit, split_text, utf16_len


def test_short_text_is_one_part() -> None:
    assert split_text("hello", 10) == ["hello"]


def test_empty_text_has_no_parts() -> None:
    assert split_text("", 10) == []


def test_prefers_paragraph_break() -> None:
    text = "a" * 30 + "\n\n" + "b" * 10 + "\n" + "c" * 5
    parts = split_text(text, 45)
    assert parts[0] == "a" * 30 + "\n\n"
    assert "".join(parts) == text


def test_prefers_line_over_sentence() -> None:
    text = "First sentence. Second sentence\nthird line here"
    parts = split_text(text, 40)
    assert parts[0] == "First sentence. Second sentence\n"


def test_prefers_sentence_over_word() -> None:
    text = "One two three. Four five six seven eight"
    parts = split_text(text, 25)
    assert parts[0] == "One two three. "


def test_word_boundary_when_no_sentence() -> None:
    text = "alpha beta gamma delta epsilon"
    parts = split_text(text, 13)
    assert parts[0] == "alpha beta "
    assert all(len(p) <= 13 for p in parts)


def test_hard_split_without_boundaries() -> None:
    assert split_text("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]


def test_early_paragraph_break_loses_to_late_line_break() -> None:
    # A paragraph break at 10% would make a tiny part; the line break near the end wins.
    text = "ab\n\n" + "c" * 30 + "\n" + "d" * 20
    parts = split_text(text, 40)
    assert parts[0] == "ab\n\n" + "c" * 30 + "\n"


def test_hard_split_keeps_combining_mark_with_its_letter() -> None:
    text = "e\u0301" * 10
    parts = split_text(text, 5)
    assert all(not p.startswith("\u0301") for p in parts)
    assert "".join(parts) == text


def test_utf16_measure_counts_astral_characters_twice() -> None:
    text = "😀" * 10
    parts = split_text(text, 5, utf16_len)
    assert all(utf16_len(p) <= 5 for p in parts)
    assert parts[0] == "😀" * 2
    assert "".join(parts) == text


def test_bad_limits_are_rejected() -> None:
    with pytest.raises(ValueError, match="limit must be positive"):
        split_text("abc", 0)
    with pytest.raises(ValueError, match="alone exceeds"):
        split_text("😀", 1, utf16_len)


def test_find_break_rejects_empty_window() -> None:
    with pytest.raises(ValueError):
        find_break("")


def test_max_fit_with_custom_measure() -> None:
    text = "a😀" * 100
    end = max_fit(text, 0, 30, utf16_len)
    assert utf16_len(text[:end]) <= 30 < utf16_len(text[: end + 1])


def test_large_input_is_fast_enough() -> None:
    text = ("word " * 30 + "\n") * 20_000  # ~3 MB
    parts = split_text(text, 4096, utf16_len)
    assert "".join(parts) == text


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["ab", " ", "c.", "!", "\n", "\n\n", "😀", "e\u0301", "word ", "\t"]), max_size=200),
       st.integers(min_value=2, max_value=60))
def test_split_properties(pieces: list[str], limit: int) -> None:
    text = "".join(pieces)
    parts = split_text(text, limit, utf16_len)
    assert "".join(parts) == text
    assert all(parts)
    assert all(utf16_len(p) <= limit for p in parts)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300), st.integers(min_value=2, max_value=50))
def test_split_properties_any_text(text: str, limit: int) -> None:
    parts = split_text(text, limit, utf16_len)
    assert "".join(parts) == text
    assert all(0 < utf16_len(p) <= limit for p in parts)
