"""Markdown (as LLMs write it) to the HTML subset Telegram accepts with ``parse_mode=HTML``.

Rendered from markdown-it-py tokens, never by regex, so nesting and escaping are
right by construction. Telegram's rules shape the output:

* only ``b i s u a code pre blockquote`` (and a few others we do not need) exist;
  headings become bold lines, lists become ``• `` / ``1. `` lines, tables a ``<pre>``;
* ``code`` may not sit inside other entities except ``blockquote``, so inline
  code closes the open styles around it and reopens them after; inside a link it is
  plain text; blockquotes do not nest, nor does the same style;
* everything outside tags is escaped (``& < >``) and attribute values also escape
  quotes; raw HTML in the Markdown is shown as text;
* links only for absolute http(s)/tg/mailto/ftp URLs of sane length (relative or odd
  ones keep their label as plain text).
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from markdown_it.token import Token

from agent.sanitize import well_formed
from channels.telegram.html_split import split_html

HR_TEXT = "——————"
BULLET = "• "
MAX_URL_LEN = 2048
MIN_PART_LIMIT = 256
_LINK_SCHEMES = re.compile(r"^(?:https?|tg|mailto|ftp)://|^mailto:|^tg:", re.IGNORECASE)
_LANG_SAFE = re.compile(r"[^A-Za-z0-9_+#.-]")
_TAG = re.compile(r"<[^>]*>")
_EMPTY_ELEMENT = re.compile(r"<([A-Za-z][A-Za-z0-9-]*)[^>]*></\1>", re.IGNORECASE)
# Prose with nothing Markdown could read as markup: no markup character anywhere, no line
# that starts like a block (indent, list, heading underline), no whitespace but spaces
# and newlines. Such text renders as itself, its lines trimmed and blank runs made one.
_MARKUP_CHARS = re.compile(r"[\\`*_~\[\]<>#|&!{}]|[^\S \n]")
_BLOCK_START = re.compile(r"^(?:[ ]+\S|[-+=]|\d+[.)])", re.MULTILINE)
_BLANK_LINES = re.compile(r"\n(?:[ ]*\n)+")
_LINE_EDGES = re.compile(r"[ ]+\n|\n[ ]+")

_md = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


def escape_text(text: str) -> str:
    """Escape text content for Telegram HTML (``& < >``)."""
    return html.escape(text, quote=False)


def escape_attr(value: str) -> str:
    """Escape an attribute value (``& < >`` and both quotes)."""
    return html.escape(value, quote=True)


def html_to_plain(markup: str) -> str:
    """The visible text of our Telegram HTML: tags dropped, entities decoded."""
    return html.unescape(_TAG.sub("", markup))


def markdown_to_html(markdown: str, *, max_url_len: int = MAX_URL_LEN) -> str:
    """Render Markdown to Telegram HTML (one string, not yet split).

    Links whose escaped URL is longer than ``max_url_len`` keep only their label.
    """
    markdown = well_formed(markdown)
    if plain := _plain_prose(markdown):
        return plain
    renderer = _Renderer(max_url_len=max_url_len)
    renderer.render(_md.parse(markdown))
    return renderer.result()


def _plain_prose(markdown: str) -> str:
    """What the renderer makes of prose without markup (most chat answers), without
    parsing it; "" when the text holds anything Markdown could read as markup."""
    if _MARKUP_CHARS.search(markdown) or _BLOCK_START.search(markdown):
        return ""
    text = _LINE_EDGES.sub("\n", _BLANK_LINES.sub("\n\n", markdown.strip(" \n")))
    return escape_text(text)


@dataclass
class _ListState:
    ordered: bool
    next_number: int
    item_indent: str = ""  # continuation lines of an item line up with its text


@dataclass
class _Style:
    name: str
    open_html: str | None  # None: nested duplicate, rendered as nothing
    emitted: bool = False  # opened lazily, so a style around nothing leaves no tags


@dataclass
class _Renderer:
    out: list[str] = field(default_factory=list)
    styles: list[_Style] = field(default_factory=list)
    lists: list[_ListState] = field(default_factory=list)
    pending_sep: str = ""
    at_container_start: bool = True
    quote_depth: int = 0
    max_url_len: int = MAX_URL_LEN

    # -- plumbing -----------------------------------------------------------------

    def result(self) -> str:
        return "".join(self.out).strip()

    def _flush_sep(self, *, indent: bool = True) -> None:
        """Write the separator owed by the previous block, if this is not a container start.

        Inside a list item, a following block is indented to the item's text.
        """
        if self.pending_sep and not self.at_container_start:
            self.out.append(self.pending_sep)
            if indent and self.lists:
                self.out.append(self.lists[-1].item_indent)
        self.pending_sep = ""
        self.at_container_start = False

    def _emit(self, text: str, *, styled: bool = True) -> None:
        """Write content; open the styles around it first (``styled``)."""
        self._flush_sep()
        if styled:
            for style in self.styles:
                if style.open_html is not None and not style.emitted:
                    self.out.append(style.open_html)
                    style.emitted = True
        self.out.append(text)

    def _end_block(self, sep: str) -> None:
        if not self.at_container_start:
            self.pending_sep = sep if len(sep) >= len(self.pending_sep) else self.pending_sep

    def _block_sep(self) -> str:
        return "\n" if self.lists else "\n\n"

    def _active(self, name: str) -> bool:
        return any(s.name == name and s.open_html is not None for s in self.styles)

    def _open(self, name: str, open_html: str) -> None:
        self.styles.append(_Style(name, None if self._active(name) else open_html))

    def _close(self, name: str) -> None:
        for i in range(len(self.styles) - 1, -1, -1):
            if self.styles[i].name == name:
                style = self.styles.pop(i)
                if style.emitted:
                    self.out.append(f"</{name}>")
                return

    # -- blocks ----------------------------------------------------------------------

    def render(self, tokens: Sequence[Token]) -> None:
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok.type == "table_open":
                i = self._table(tokens, i)
                continue
            self._block(tok)
            i += 1

    def _block(self, tok: Token) -> None:
        t = tok.type
        if t == "paragraph_open":
            return
        if t == "paragraph_close":
            self._end_block(self._block_sep())
        elif t == "heading_open":
            self._open("b", "<b>")
        elif t == "heading_close":
            self._close("b")
            self._end_block(self._block_sep())
        elif t == "inline":
            self._inline(tok.children or [])
        elif t in ("bullet_list_open", "ordered_list_open"):
            start = tok.attrs.get("start", 1)
            self.lists.append(_ListState(t == "ordered_list_open", int(start)))
            self._end_block("\n")
        elif t in ("bullet_list_close", "ordered_list_close"):
            self.lists.pop()
            self._end_block(self._block_sep())
        elif t == "list_item_open":
            self._list_item()
        elif t == "list_item_close":
            # Even an empty item ends its line.
            self.at_container_start = False
            self._end_block("\n")
        elif t == "blockquote_open":
            self._blockquote_open()
        elif t == "blockquote_close":
            self._blockquote_close()
        elif t in ("fence", "code_block"):
            self._code_block(tok)
        elif t == "hr":
            self._emit(HR_TEXT, styled=False)
            self._end_block(self._block_sep())
        elif t == "html_block":
            self._emit(escape_text(tok.content.rstrip("\n")))
            self._end_block(self._block_sep())

    def _list_item(self) -> None:
        state = self.lists[-1]
        if state.ordered:
            marker = f"{state.next_number}. "
            state.next_number += 1
        else:
            marker = BULLET
        indent = self.lists[-2].item_indent if len(self.lists) > 1 else ""
        self._flush_sep(indent=False)
        self._emit(indent + marker, styled=False)
        state.item_indent = indent + " " * len(marker)
        # The item's first block continues on the marker's line.
        self.at_container_start = True
        self.pending_sep = ""

    def _blockquote_open(self) -> None:
        self.quote_depth += 1
        if self.quote_depth == 1:
            self._emit("<blockquote>", styled=False)
            self.at_container_start = True
            self.pending_sep = ""

    def _blockquote_close(self) -> None:
        self.quote_depth -= 1
        if self.quote_depth == 0:
            self.pending_sep = ""
            self.out.append("</blockquote>")
            self.at_container_start = False
        self._end_block(self._block_sep())

    def _code_block(self, tok: Token) -> None:
        code = tok.content.rstrip("\n")
        lang = _LANG_SAFE.sub("", (tok.info or "").strip().split(" ")[0])[:32]
        open_code = f'<code class="language-{escape_attr(lang)}">' if lang else "<code>"
        if not code:
            code = " "
        self._emit(f"<pre>{open_code}{escape_text(code)}</code></pre>", styled=False)
        self._end_block(self._block_sep())

    def _table(self, tokens: Sequence[Token], i: int) -> int:
        """Render a GFM table as aligned plain text in ``<pre>``; returns the next index."""
        rows: list[list[str]] = []
        while i < len(tokens) and tokens[i].type != "table_close":
            tok = tokens[i]
            if tok.type == "tr_open":
                rows.append([])
            elif tok.type == "inline" and rows:
                rows[-1].append(_plain_inline(tok.children or []))
            i += 1
        widths = [max((len(r[c]) for r in rows if c < len(r)), default=0) for c in range(max(map(len, rows), default=0))]
        lines = []
        for n, row in enumerate(rows):
            cells = [row[c].ljust(widths[c]) if c < len(row) else " " * widths[c] for c in range(len(widths))]
            lines.append(" | ".join(cells).rstrip())
            if n == 0:
                lines.append("-+-".join("-" * w for w in widths))
        if lines:
            self._emit(f"<pre>{escape_text(chr(10).join(lines))}</pre>", styled=False)
            self._end_block(self._block_sep())
        return i + 1

    # -- inline ----------------------------------------------------------------------

    def _inline(self, children: Sequence[Token]) -> None:
        for tok in children:
            t = tok.type
            if t == "text":
                self._emit(escape_text(tok.content))
            elif t in ("softbreak", "hardbreak"):
                self._emit("\n" + (self.lists[-1].item_indent if self.lists else ""))
            elif t == "code_inline":
                self._inline_code(tok.content)
            elif t == "strong_open":
                self._open("b", "<b>")
            elif t == "strong_close":
                self._close("b")
            elif t == "em_open":
                self._open("i", "<i>")
            elif t == "em_close":
                self._close("i")
            elif t == "s_open":
                self._open("s", "<s>")
            elif t == "s_close":
                self._close("s")
            elif t == "link_open":
                self._link_open(str(tok.attrs.get("href", "")))
            elif t == "link_close":
                self._close("a")
            elif t == "image":
                self._image(tok)
            elif t == "html_inline":
                self._emit(escape_text(tok.content))

    def _inline_code(self, code: str) -> None:
        if self._active("a"):
            self._emit(escape_text(code))
            return
        # Telegram does not allow code inside other styles: close them, reopen lazily.
        for style in reversed(self.styles):
            if style.emitted:
                self.out.append(f"</{style.name}>")
                style.emitted = False
        self._emit(f"<code>{escape_text(code)}</code>", styled=False)

    def _link_open(self, href: str) -> None:
        if self._active("a") or not _linkable(href, self.max_url_len):
            self.styles.append(_Style("a", None))
            return
        self._open("a", f'<a href="{escape_attr(href)}">')

    def _image(self, tok: Token) -> None:
        label = _plain_inline(tok.children or []) or "image"
        src = str(tok.attrs.get("src", ""))
        if _linkable(src, self.max_url_len) and not self._active("a"):
            self._emit(f'<a href="{escape_attr(src)}">{escape_text(label)}</a>')
        else:
            self._emit(escape_text(label))


def _linkable(href: str, max_len: int) -> bool:
    return bool(href) and len(escape_attr(href)) <= max_len and bool(_LINK_SCHEMES.match(href))


def _plain_inline(children: Sequence[Token]) -> str:
    """The text of inline tokens without any markup (table cells, image labels)."""
    parts: list[str] = []
    for tok in children:
        if tok.type in ("text", "code_inline", "html_inline"):
            parts.append(tok.content)
        elif tok.type in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif tok.type == "image":
            parts.append(_plain_inline(tok.children or []))
    return "".join(parts)


def render_parts(markdown: str, limit: int) -> list[str]:
    """Markdown to Telegram HTML messages of at most ``limit`` UTF-16 units each.

    Parts whose visible text is blank are dropped (Telegram rejects empty messages).
    URLs are capped below half the limit (and code languages at 32 characters), so the
    tags a part must reopen (a blockquote, three styles and a link, or a blockquote and
    ``<pre><code>``) always leave room for text.
    """
    if limit < MIN_PART_LIMIT:
        raise ValueError(f"limit must be at least {MIN_PART_LIMIT} to leave room beside reopened tags")
    max_url = min(MAX_URL_LEN, (limit - 128) // 2)
    markup = markdown_to_html(markdown, max_url_len=max_url)
    # UTF-16 units as split_html counts them (a lone surrogate from the model is one unit).
    if len(markup.encode("utf-16-le", "surrogatepass")) // 2 <= limit and not _EMPTY_ELEMENT.search(markup):
        # Most answers fit one message: what split_html would return for the renderer's
        # balanced output (one part, nothing to drop), without cutting it into units.
        parts = [markup]
    else:
        parts = split_html(markup, limit)
    return [part for part in parts if html_to_plain(part).strip()]


def render_preview(markdown: str, limit: int) -> str:
    """The first message's worth of a partial answer, with an ellipsis if more follows.

    Only the head of the text is rendered: previews repeat while a long answer
    streams, and a quarter more than the limit nearly always fills one message.
    """
    head = markdown[: limit + limit // 4]
    parts = render_parts(head, limit - 2)
    if not parts:
        return ""
    more = len(parts) > 1 or len(head) < len(markdown)
    return parts[0] + "\n…" if more else parts[0]
