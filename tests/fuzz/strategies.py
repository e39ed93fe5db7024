"""Hypothesis strategies shared by the fuzz tests: JSON-ish values and hostile Unicode text."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# -- text -------------------------------------------------------------------------------------

# Pieces that stress length units, grapheme boundaries and bidi handling.
HOSTILE_PIECES = (
    "😀", "👍🏽", "🇩🇪", "🏳️‍🌈", "👨‍👩‍👧‍👦", "👩🏾‍💻", "❤️", "1️⃣", "\U0001f9d1\u200d\U0001f680",  # emoji (UTF-16 pairs, ZWJ)
    "e\u0301", "a\u0300\u0316\u0347", "\u0915\u094d\u0937",  # combining marks, a conjunct
    "\u202e", "\u202d", "\u200f", "\u200e", "\u2066", "\u2069",  # bidi controls
    "שלום", "مرحبا", "abc\u202edef",  # RTL text
    "\x00", "\x1b[31m", "\x7f", "\ufeff", "\u200b", "\u2028", "\u2029",  # NUL, escapes, invisibles
    "\r\n", "\n", "\n\n", "\t", " ", "\u00a0", "\u3000",  # line and space variants
    "。", "！", "…", ". ", "? ", "!",  # sentence ends
    "<", ">", "&", "&amp;", "&lt;b&gt;", "<b>", "</i>", "`", "```", "*", "_", "~", "|", "#", "> ",
    "<!channel>", "<!here>", "<!everyone>", "<@U123ABC>", "<#C1|general>", "<https://x.y|z>",
    "@channel", "@here",
    "x" * 300, "ﷺ" * 40, "😀" * 150, "a\u0301" * 120,  # very long words
    "word ", "another ", "http://example.com/a_b*c ", "[link](https://example.com) ",
)

# Without lone surrogates (which no UTF-8 text can carry).
hostile_text = st.one_of(
    st.lists(st.sampled_from(HOSTILE_PIECES), max_size=60).map("".join),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=400),
    st.lists(
        st.one_of(st.sampled_from(HOSTILE_PIECES), st.text(st.characters(exclude_categories=("Cs",)), max_size=20)),
        max_size=40,
    ).map("".join),
)



def text_without(chars: str) -> st.SearchStrategy[str]:
    """Hostile text with ``chars`` removed and something visible in it (no filtering: no give-ups)."""
    table = str.maketrans("", "", chars)
    return hostile_text.map(lambda t: t.translate(table)).map(lambda t: t if t.strip() else t + "x")


# Markdown-shaped pieces (as models write them), mixed with hostile text.
MARKDOWN_PIECES = (
    "**", "__", "*", "_", "~~", "`", "```", "```py\n", "\n```\n", "# ", "## ", "> ", "- ", "1. ", "    ",
    "[", "](", ")", "](https://example.com/x?a=1&b=<2>)", "![img](https://example.com/i.png)",
    "| a | b |\n|---|---|\n| 1 | 2 |\n", "---\n", "<br>", "<script>", "&", "\n", "\n\n",
)

markdown_text = st.lists(
    st.one_of(st.sampled_from(MARKDOWN_PIECES), st.sampled_from(HOSTILE_PIECES), st.text(max_size=12)),
    max_size=120,
).map("".join)


# Lone surrogates: a Python string may hold them (e.g. from a JSON "\ud83d" escape, or a
# surrogate pair split across two streamed deltas), though no UTF-8 text can.
LONE_SURROGATES = ("\ud83d", "\ude00", "\udfff", "\ud800")

with_lone_surrogates = st.lists(
    st.one_of(markdown_text, st.sampled_from(LONE_SURROGATES), st.sampled_from(HOSTILE_PIECES)), max_size=10
).map("".join)


def utf16_units(text: str) -> int:
    """UTF-16 length, counting a lone surrogate as the one unit it would be."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


# -- JSON -------------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
)

json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=20,
)


def mutate(data: Any, draw: Any, keys: st.SearchStrategy[str] | None = None, depth: int = 0) -> Any:
    """A copy of ``data`` with random fields dropped, retyped or added, at any depth."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            action = draw(st.sampled_from(("keep", "keep", "keep", "recurse", "drop", "replace")))
            if action == "drop":
                continue
            if action == "replace":
                out[key] = draw(json_values)
            elif action == "recurse" and depth < 6:
                out[key] = mutate(value, draw, keys, depth + 1)
            else:
                out[key] = value
        if draw(st.integers(0, 5)) == 0:
            out[draw(keys if keys is not None else st.text(max_size=12))] = draw(json_values)
        return out
    if isinstance(data, list):
        items = [mutate(v, draw, keys, depth + 1) if depth < 6 else v for v in data]
        if items and draw(st.booleans()):
            items.pop(draw(st.integers(0, len(items) - 1)))
        return items
    if draw(st.integers(0, 3)) == 0:
        return draw(json_values)
    return data
