"""Markdown (as the model writes it) to Slack mrkdwn, from markdown-it-py tokens.

Bold ``*x*``, italic ``_x_``, strike ``~x~``, inline code, fences, links ``<url|text>``,
lists as ``• `` / ``1. ``, headings as bold lines, quotes ``> ``, tables as aligned
text in a code block. Raw HTML is not interpreted (it is shown as text), and all model
text is escaped (see mrkdwn.py), which renders mentions the model writes inert.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from markdown_it import MarkdownIt
from markdown_it.token import Token

from agent.sanitize import well_formed
from channels.slack.mrkdwn import Block, CodeBlock, Line, Run, Style, TextBlock, safe_url
from channels.slack.split import MIN_LIMIT, split_blocks

SLACK_TEXT_LIMIT = 4000
RULE = "──────────"

_MARKERS = {"strong_open": "*", "em_open": "_", "s_open": "~"}
_CLOSERS = {"strong_close": "*", "em_close": "_", "s_close": "~"}

# One line no Markdown construct can start in: a letter first (no list marker, heading,
# quote or indented code), then letters, digits, spaces and punctuation that means
# nothing here (no emphasis, code, link, entity, HTML or escape), no trailing space.
# Such text renders as itself, so short plain answers skip the parse.
_PLAIN_LINE = re.compile(r"[^\W\d_](?:[^\W_]|[ ,.;:?!'\"%$@/()+=-])*(?<! )")

_PARSER = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


@dataclass
class _List:
    ordered: bool
    tight: bool
    started: bool = False


@dataclass
class _Item:
    marker: str
    indent: str
    first_line_done: bool = False


class _BlockRenderer:
    """Walks block tokens, tracking quote and list containers for line prefixes."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.quote_depth = 0
        self.lists: list[_List] = []
        self.items: list[_Item] = []
        self.heading = False
        self.table_rows: list[list[str]] | None = None
        self.tight_lists: set[int] = set()

    # -- prefixes ---------------------------------------------------------------------
    def _quote(self) -> str:
        return "> " if self.quote_depth else ""

    def _next_prefix(self) -> tuple[str, str]:
        """(prefix of the next line, prefix of its continuations)."""
        if not self.items:
            return self._quote(), self._quote()
        item = self.items[-1]
        cont = self._quote() + item.indent + " " * len(item.marker)
        if item.first_line_done:
            return cont, cont
        item.first_line_done = True
        return self._quote() + item.indent + item.marker, cont

    def _sep(self) -> str:
        """Blocks of a tight list (and a list nested in one) sit on consecutive lines."""
        if not self.lists:
            return "\n\n"
        inner = self.lists[-1]
        if inner.started:
            return "\n" if inner.tight else "\n\n"
        inner.started = True
        if len(self.lists) > 1 and self.lists[-2].tight:
            return "\n"
        return "\n\n"

    # -- walking ----------------------------------------------------------------------
    def render(self, tokens: list[Token]) -> list[Block]:
        self.tight_lists = _tight_lists(tokens)
        for index, token in enumerate(tokens):
            self._token(index, token)
        return self.blocks

    def _token(self, index: int, token: Token) -> None:
        kind = token.type
        if kind == "blockquote_open":
            self.quote_depth += 1
        elif kind == "blockquote_close":
            self.quote_depth -= 1
        elif kind in ("bullet_list_open", "ordered_list_open"):
            tight = index in self.tight_lists
            self.lists.append(_List(ordered=kind == "ordered_list_open", tight=tight))
        elif kind in ("bullet_list_close", "ordered_list_close"):
            self.lists.pop()
        elif kind == "list_item_open":
            ordered = self.lists[-1].ordered if self.lists else False
            marker = f"{token.info or '1'}. " if ordered else "• "
            self.items.append(_Item(marker=marker, indent="    " * (len(self.lists) - 1)))
        elif kind == "list_item_close":
            item = self.items.pop()
            if not item.first_line_done:  # an empty item still shows its bullet
                self.items.append(item)
                prefix, cont = self._next_prefix()
                self.items.pop()
                self._add_text([Line(prefix, [], cont)])
        elif kind == "heading_open":
            self.heading = True
        elif kind == "heading_close":
            self.heading = False
        elif kind == "inline":
            self._inline(token)
        elif kind in ("fence", "code_block"):
            lines = token.content.rstrip("\n").split("\n")
            self._mark_item_line()
            self.blocks.append(CodeBlock(lines=lines, prefix=self._quote(), sep=self._sep()))
        elif kind == "hr":
            prefix, cont = self._next_prefix()
            self._add_text([Line(prefix, [Run(RULE)], cont)])
        elif kind == "table_open":
            self.table_rows = []
        elif kind == "tr_open" and self.table_rows is not None:
            self.table_rows.append([])
        elif kind == "table_close" and self.table_rows is not None:
            self._mark_item_line()
            lines = _table_lines(self.table_rows)
            self.table_rows = None
            self.blocks.append(CodeBlock(lines=lines, prefix=self._quote(), sep=self._sep()))
        elif kind == "html_block":
            self._plain_block(token.content)

    def _mark_item_line(self) -> None:
        if self.items:
            self.items[-1].first_line_done = True

    def _inline(self, token: Token) -> None:
        if self.table_rows is not None:
            if self.table_rows:
                self.table_rows[-1].append(_plain_text(token.children or []))
            return
        base: Style = ("*",) if self.heading else ()
        runs_per_line = _inline_lines(token.children or [], base)
        lines: list[Line] = []
        for runs in runs_per_line:
            prefix, cont = self._next_prefix()
            lines.append(Line(prefix, runs, cont))
        self._add_text(lines)

    def _plain_block(self, content: str) -> None:
        lines = []
        for raw in content.rstrip("\n").split("\n"):
            prefix, cont = self._next_prefix()
            lines.append(Line(prefix, [Run(raw)], cont))
        self._add_text(lines)

    def _add_text(self, lines: list[Line]) -> None:
        if lines:
            self.blocks.append(TextBlock(lines=lines, sep=self._sep()))


def _tight_lists(tokens: list[Token]) -> set[int]:
    """Indexes of the list-open tokens of tight lists.

    markdown-it marks the paragraphs of a tight list hidden; the list token has no flag.
    """
    tight: set[int] = set()
    for index, token in enumerate(tokens):
        if token.type not in ("bullet_list_open", "ordered_list_open"):
            continue
        verdict = True
        for inner in tokens[index + 1 :]:
            if inner.level <= token.level:
                break
            if inner.type == "paragraph_open" and inner.level == token.level + 2:
                verdict = inner.hidden
                break
        if verdict:
            tight.add(index)
    return tight


def _inline_lines(children: list[Token], base: Style) -> list[list[Run]]:
    """Inline tokens to runs, one list per output line (Slack styles do not span lines)."""
    lines: list[list[Run]] = [[]]
    active: list[str] = list(base)
    link: tuple[str, list[str]] | None = None  # (href, label parts) while inside a link

    def style() -> Style:
        seen: list[str] = []
        for marker in active:
            if marker not in seen:
                seen.append(marker)
        return tuple(seen)

    for child in children:
        kind = child.type
        if link is not None:
            if kind == "link_close":
                lines[-1].extend(_link_runs(link[0], "".join(link[1]), style()))
                link = None
            elif kind in ("text", "code_inline", "html_inline"):
                link[1].append(child.content)
            elif kind in ("softbreak", "hardbreak"):
                link[1].append(" ")
            elif kind == "image":
                link[1].append(child.content or "")
            continue
        if kind in _MARKERS:
            active.append(_MARKERS[kind])
        elif kind in _CLOSERS:
            marker = _CLOSERS[kind]
            for i in range(len(active) - 1, len(base) - 1, -1):
                if active[i] == marker:
                    del active[i]
                    break
        elif kind == "code_inline":
            lines[-1].append(Run(child.content, style(), "code"))
        elif kind == "link_open":
            link = (str(child.attrs.get("href", "")), [])
        elif kind == "image":
            src = str(child.attrs.get("src", ""))
            lines[-1].extend(_link_runs(src, child.content or "image", style()))
        elif kind in ("softbreak", "hardbreak"):
            lines.append([])
        else:  # text, html_inline and anything unknown: shown as text
            if child.content:
                lines[-1].append(Run(child.content, style()))
    if link is not None:  # unterminated (cannot happen with markdown-it, kept for safety)
        lines[-1].append(Run("".join(link[1]), style()))
    return lines


def _link_runs(href: str, label: str, style: Style) -> list[Run]:
    url = safe_url(href)
    if url is None:
        text = label if label else href
        return [Run(text, style)] if text else []
    return [Run(label, style, "link", url)]


def _plain_text(children: list[Token]) -> str:
    parts: list[str] = []
    for child in children:
        if child.type in ("text", "code_inline", "html_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif child.type == "image":
            parts.append(child.content or "")
    return "".join(parts)


def _table_lines(rows: list[list[str]]) -> list[str]:
    if not rows:
        return []
    width = max(len(row) for row in rows)
    cols = [max((len(row[i]) if i < len(row) else 0) for row in rows) for i in range(width)]
    out = []
    for n, row in enumerate(rows):
        cells = [(row[i] if i < len(row) else "").ljust(cols[i]) for i in range(width)]
        out.append(" | ".join(cells).rstrip())
        if n == 0 and len(rows) > 1:
            out.append("-+-".join("-" * c for c in cols))
    return out


def render_blocks(markdown: str) -> list[Block]:
    """The mrkdwn document model of ``markdown``."""
    return _BlockRenderer().render(_PARSER.parse(well_formed(markdown)))


def to_mrkdwn(markdown: str) -> str:
    """The whole text as one mrkdwn string (no length limit)."""
    parts: list[str] = []
    for block in render_blocks(markdown):
        rendered = block.render()
        if parts:
            parts.append(block.sep)
        parts.append(rendered)
    return "".join(parts).strip("\n")


def format_parts(markdown: str, limit: int = SLACK_TEXT_LIMIT) -> list[str]:
    """Slack message texts of at most ``limit`` characters each; [] when nothing shows."""
    markdown = well_formed(markdown)
    if limit >= MIN_LIMIT and len(markdown) <= limit and _PLAIN_LINE.fullmatch(markdown):
        return [markdown]
    return split_blocks(render_blocks(markdown), limit)


def preview_part(markdown: str, limit: int = SLACK_TEXT_LIMIT) -> str | None:
    """What a live preview shows of ``markdown`` so far: its first part (marked when more follows)."""
    parts = format_parts(markdown, limit)
    if len(parts) <= 1:
        return parts[0] if parts else None
    return format_parts(markdown, limit - 2)[0] + "\n…"
