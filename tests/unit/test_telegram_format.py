"""Markdown -> Telegram HTML rendering and the markup-aware splitter."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.chunking import utf16_len
from channels.telegram import format as format_module
from channels.telegram.format import html_to_plain, markdown_to_html, render_parts, render_preview
from channels.telegram.html_split import split_html
from tests.fakes.telegram_html import TelegramHTMLError, parse_telegram_html


class _Balance(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with stack {self.stack}")
        else:
            self.stack.pop()


def assert_balanced(part: str) -> None:
    parser = _Balance()
    parser.feed(part)
    parser.close()
    assert not parser.errors, parser.errors
    assert not parser.stack, f"unclosed {parser.stack} in {part!r}"


# -- rendering ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
        ("**bold** and *it* and ~~gone~~", "<b>bold</b> and <i>it</i> and <s>gone</s>"),
        ("**bold _both_**", "<b>bold <i>both</i></b>"),
        ("`x < 1`", "<code>x &lt; 1</code>"),
        ("**a `c` b**", "<b>a </b><code>c</code><b> b</b>"),
        ("```python\nif a < b:\n    pass\n```", '<pre><code class="language-python">if a &lt; b:\n    pass</code></pre>'),
        ("    indented\n    code", "<pre><code>indented\ncode</code></pre>"),
        ("[site](https://example.com/?a=1&b=2)", '<a href="https://example.com/?a=1&amp;b=2">site</a>'),
        ('[q](https://e.com/"x")', '<a href="https://e.com/%22x%22">q</a>'),
        ("[rel](/local/path)", "rel"),
        ("[js](javascript:alert(1))", "[js](javascript:alert(1))"),
        ("<https://example.com>", '<a href="https://example.com">https://example.com</a>'),
        ("# Title\n\nBody", "<b>Title</b>\n\nBody"),
        ("## **Bold** title", "<b>Bold title</b>"),
        ("> quoted\n> text", "<blockquote>quoted\ntext</blockquote>"),
        ("> outer\n>> inner", "<blockquote>outer\n\ninner</blockquote>"),
        ("- one\n- two", "• one\n• two"),
        ("3. three\n4. four", "3. three\n4. four"),
        ("- a\n  - b", "• a\n  • b"),
        ("a\n\n---\n\nb", "a\n\n——————\n\nb"),
        ("<b>raw</b> <script>x</script>", "&lt;b&gt;raw&lt;/b&gt; &lt;script&gt;x&lt;/script&gt;"),
        ("![cat](https://img.example/cat.png)", '<a href="https://img.example/cat.png">cat</a>'),
        ("[`code` link](https://e.com)", '<a href="https://e.com">code link</a>'),
        ("line one  \nline two", "line one\nline two"),
        ("", ""),
        ("   \n\n  ", ""),
    ],
)
def test_render_cases(markdown: str, expected: str) -> None:
    assert markdown_to_html(markdown) == expected


def test_table_becomes_preformatted_text() -> None:
    out = markdown_to_html("| a | b |\n|---|---|\n| 1 | <2> |")
    assert out == "<pre>a | b\n--+----\n1 | &lt;2&gt;</pre>"


def test_quotes_in_link_attribute_are_escaped() -> None:
    # markdown-it percent-encodes double quotes; a single quote stays and is escaped.
    out = markdown_to_html("[x](<https://e.com/a'b>)")
    assert out == '<a href="https://e.com/a&#x27;b">x</a>'
    parse_telegram_html(out)


def test_code_language_is_sanitized() -> None:
    out = markdown_to_html('```py"><b onload=x\ncode\n```')
    assert out.startswith('<pre><code class="language-pyb">')
    parse_telegram_html(out)


def test_rich_document_is_valid_telegram_html() -> None:
    md = (
        "# Report\n\nSome **bold _nested ~~deep~~_** text with `code` and a [link](https://x.org).\n\n"
        "> a quote with **bold** and `code`\n\n"
        "1. first\n2. second with `inline`\n   - sub *item*\n\n"
        "```js\nconst a = '<tag>' && b;\n```\n\n| h1 | h2 |\n|--|--|\n| c | d |\n"
    )
    out = markdown_to_html(md)
    visible = parse_telegram_html(out)
    assert "const a = '<tag>' && b;" in visible
    assert html_to_plain(out) == visible


def test_html_to_plain_unescapes() -> None:
    assert html_to_plain('<b>a &lt; b</b> <a href="x">&amp;</a>') == "a < b &"


# -- splitting --------------------------------------------------------------------------


def test_long_answer_splits_on_paragraphs() -> None:
    paragraph = "word " * 150  # 750 chars
    md = "\n\n".join(f"**P{i}** {paragraph}" for i in range(12))
    parts = render_parts(md, 4096)
    assert len(parts) >= 3
    for part in parts:
        assert utf16_len(part) <= 4096
        assert_balanced(part)
        parse_telegram_html(part)
        assert part.startswith("<b>P")  # every part begins at a paragraph


def test_code_block_split_reopens_pre_code() -> None:
    md = "```python\n" + "\n".join(f"print({i})  # <{i}>" for i in range(600)) + "\n```"
    parts = render_parts(md, 4096)
    assert len(parts) > 1
    for part in parts:
        assert part.startswith('<pre><code class="language-python">')
        assert part.endswith("</code></pre>")
        parse_telegram_html(part)
    joined = "".join(html_to_plain(p) for p in parts)
    assert joined.replace("\n", "") == html_to_plain(markdown_to_html(md)).replace("\n", "")


def test_split_never_cuts_entity_or_tag() -> None:
    markup = "<b>" + "&amp;" * 50 + "</b>"
    parts = split_html(markup, 20)
    for part in parts:
        assert_balanced(part)
        parse_telegram_html(part)
    assert "".join(html_to_plain(p) for p in parts) == "&" * 50


def test_split_reopens_link_with_its_href() -> None:
    markup = '<a href="https://e.com/?q=&quot;x&quot;">' + "word " * 40 + "</a>"
    parts = split_html(markup, 80)
    assert len(parts) > 1
    for part in parts:
        assert part.startswith('<a href="https://e.com/?q=&quot;x&quot;">') and part.endswith("</a>")


def test_split_rejects_unbalanced_markup() -> None:
    with pytest.raises(ValueError, match="unbalanced"):
        split_html("<b>open", 100)
    with pytest.raises(ValueError, match="unbalanced"):
        split_html("text</i>", 100)


def test_split_rejects_markup_too_long_for_limit() -> None:
    with pytest.raises(ValueError, match="no room"):
        split_html('<a href="https://example.com/very/long">x</a>', 10)


def test_render_parts_rejects_tiny_limits() -> None:
    with pytest.raises(ValueError, match="at least 256"):
        render_parts("text", 100)


def test_long_urls_are_not_linked_when_they_would_crowd_a_part() -> None:
    url = "https://example.com/" + "a" * 300
    [part] = render_parts(f"[label]({url})", 400)
    assert part == "label"
    assert render_parts(f"[label]({url})", 4096)[0].startswith('<a href="https://example.com/')


def test_preview_is_truncated_with_ellipsis() -> None:
    preview = render_preview("para " * 2000, 4096)
    assert utf16_len(preview) <= 4096
    assert preview.endswith("\n…")
    assert render_preview("short *x*", 4096) == "short <i>x</i>"


def test_astral_characters_count_double() -> None:
    parts = render_parts("😀" * 5000, 4096)
    assert all(utf16_len(p) <= 4096 for p in parts)
    assert "".join(parts) == "😀" * 5000


# -- properties -----------------------------------------------------------------------------

_md_pieces = st.sampled_from([
    "word ", "longerword ", "**bold ", "bold** ", "*it* ", "_em_ ", "~~s~~ ", "`co<de>` ", "[l](https://e.com/?a=\"1\"&b) ",
    "\n", "\n\n", "# Head\n", "> quote ", "- item\n", "1. one\n", "```py\nx < 1 && y\n```\n", "<tag> ", "& ", "😀",
    "é", ". ", "| a | b |\n|---|---|\n| 1 | 2 |\n", "    code\n", "---\n",
])


@settings(max_examples=80, deadline=None)
@given(st.lists(_md_pieces, max_size=200), st.integers(min_value=256, max_value=700))
def test_render_parts_properties(pieces: list[str], limit: int) -> None:
    md = "".join(pieces)
    whole = markdown_to_html(md)
    parts = render_parts(md, limit)
    for part in parts:
        assert utf16_len(part) <= limit
        assert_balanced(part)
        try:
            parse_telegram_html(part)
        except TelegramHTMLError as exc:  # pragma: no cover - shown on failure
            raise AssertionError(f"{exc}: {part!r}") from exc
    # Nothing visible is lost or invented (blank parts are dropped, so compare without whitespace).
    joined = "".join(html_to_plain(p) for p in parts)
    assert "".join(joined.split()) == "".join(html_to_plain(whole).split())


_inline_tags = st.sampled_from(["b", "i", "s", "u"])


@st.composite
def _balanced_markup(draw: st.DrawFn, depth: int = 0) -> str:
    out = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["text", "text", "entity", "tag"] if depth < 3 else ["text", "entity"]))
        if kind == "text":
            out.append(draw(st.text(alphabet=st.sampled_from(list("ab .\n😀é")), max_size=30)))
        elif kind == "entity":
            out.append(draw(st.sampled_from(["&amp;", "&lt;", "&gt;", "&quot;", "&#128512;"])))
        else:
            tag = draw(_inline_tags)
            out.append(f"<{tag}>" + draw(_balanced_markup(depth + 1)) + f"</{tag}>")
    return "".join(out)


@settings(max_examples=120, deadline=None)
@given(_balanced_markup(), st.integers(min_value=40, max_value=120))
def test_split_html_properties(markup: str, limit: int) -> None:
    parts = split_html(markup, limit)
    for part in parts:
        assert utf16_len(part) <= limit
        assert_balanced(part)
    assert "".join(html_to_plain(p) for p in parts) == html_to_plain(markup)


@pytest.mark.parametrize("md", [
    "", "   ", "plain words", "**bold** and _it_ and `code`", "****", "[](https://example.com)",
    "[label](relative/link)", "> quote\n>> nested", "- a\n- b\n\n1. one\n2. two", "---",
    "| a | b |\n|---|---|\n| 1 | 2 |", "```python\nx < 1 & y\n```", "emoji 😀 " * 30,
    "<b>raw html</b> & entities &amp;", "~~gone~~ **_both_**", "a\\\nb  \nc",
])
def test_one_message_answers_are_split_as_the_splitter_would(md: str) -> None:
    markup = markdown_to_html(md)
    assert render_parts(md, 4096) == [p for p in split_html(markup, 4096) if html_to_plain(p).strip()]


def _parsed(md: str) -> str:
    """The Markdown parser's rendering, the plain-prose shortcut bypassed."""
    renderer = format_module._Renderer()
    renderer.render(format_module._md.parse(md))
    return renderer.result()


# Prose and the characters that decide whether it is prose: block starts, line edges, blank
# runs, other whitespace, markup characters, non-ASCII.
_PROSE = st.lists(st.sampled_from([
    *"ab yz19.),:;?'\"()/%$@^", "\n", "\n\n", "  ", "-", "+", "=", "*", "_", "`", "#", ">", "<", "&",
    "!", "[", "|", "~", "\\", "\t", "\xa0", "é", "日", "😀", "1. ", "2) ",
]), max_size=40).map("".join)


@settings(max_examples=600, deadline=None)
@given(_PROSE)
def test_prose_without_markup_renders_as_the_parser_renders_it(md: str) -> None:
    assert markdown_to_html(md) == _parsed(md)


@pytest.mark.parametrize("md", [
    "Hello there.", "a\nb", "a  \nb", "a\n\n\n b", "one\n \ntwo", " lead and trail \n", "1+1=2, 3.5 (ok)?",
    "2026 was a year.", "é 日本 😀", "x\n-", "x\n===", "    code", "1. item", "2) item", "- item", "+ item",
])
def test_the_plain_prose_shortcut_agrees_with_the_parser(md: str) -> None:
    assert markdown_to_html(md) == _parsed(md)
