"""Cut rendered mrkdwn into Slack messages of at most ``limit`` characters.

The boundaries are those of the Telegram splitter, best first: between blocks
(paragraphs), between lines, after a sentence, between words, and only as a last resort
inside a word (that last cut is channels.chunking.split_text's). Because the input is the structured model of mrkdwn.py rather than a
string, a cut never breaks formatting: styles are closed at the end of a part and
reopened at the start of the next, and a code block cut in two is closed with a fence
and reopened with one, so every part renders on its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TypeVar

from channels.chunking import split_text
from channels.slack.mrkdwn import (
    Block,
    CodeBlock,
    Line,
    Run,
    Style,
    TextBlock,
    escape_text,
    render_runs,
    transition,
)

MIN_LIMIT = 64

_WORD = re.compile(r"\s*\S+\s*|\s+")
_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*\s+$")

T = TypeVar("T")


def split_blocks(blocks: Sequence[Block], limit: int) -> list[str]:
    """Pack blocks into parts (joined by their separators), splitting any that is too long."""
    if limit < MIN_LIMIT:
        raise ValueError(f"limit must be at least {MIN_LIMIT} characters, got {limit}")
    parts = _pack(blocks, lambda b: b.sep, lambda b: b.render(), lambda b: _split_block(b, limit), limit)
    return [part for part in (p.strip("\n") for p in parts) if part.strip()]


def _pack(
    items: Sequence[T],
    sep_of: Callable[[T], str],
    render: Callable[[T], str],
    split: Callable[[T], list[str]],
    limit: int,
) -> list[str]:
    """Greedy packing: as many whole items per part as fit; oversize items are split."""
    parts: list[str] = []
    current = ""
    for item in items:
        text = render(item)
        candidate = current + sep_of(item) + text if current else text
        if len(candidate) <= limit:
            current = candidate
            continue
        if current:
            parts.append(current)
            current = ""
        if len(text) <= limit:
            current = text
            continue
        pieces = split(item)
        parts.extend(pieces[:-1])
        current = pieces[-1] if pieces else ""
    if current:
        parts.append(current)
    return parts


def _split_block(block: Block, limit: int) -> list[str]:
    if isinstance(block, CodeBlock):
        return _split_code(block, limit)
    return _split_text(block, limit)


def _split_text(block: TextBlock, limit: int) -> list[str]:
    return _pack(
        block.lines, lambda _: "\n", lambda line: line.render(), lambda line: split_line(line, limit), limit
    )


# -- code blocks ----------------------------------------------------------------------


def _split_code(block: CodeBlock, limit: int) -> list[str]:
    opener, closer = block.opener(), block.closer()
    budget = limit - len(opener) - len(closer)
    rendered: list[str] = []
    for raw in block.lines:
        line = block.render_line(raw)
        if len(line) <= budget:
            rendered.append(line)
            continue
        line_budget = budget - len(block.prefix)
        rendered.extend(block.prefix + escape_text(chunk) for chunk in _hard_split(raw, line_budget))
    bodies = _pack(rendered, lambda _: "\n", lambda s: s, lambda s: [s], budget)
    return [opener + body + closer for body in bodies]


def _escaped_len(raw: str) -> int:
    return len(escape_text(raw))


def _hard_split(raw: str, budget: int) -> list[str]:
    """Cut a piece too long for any part: channels.chunking picks the least bad places
    (a space, else never inside a combining sequence), measured after escaping."""
    return split_text(raw, budget, measure=_escaped_len) or [raw]


# -- lines ----------------------------------------------------------------------------


def _pieces(runs: list[Run], budget: int) -> list[Run]:
    """Runs cut into words (text) or kept whole (code, links), each small enough to fit."""
    out: list[Run] = []
    for run in runs:
        if run.kind == "text":
            out.extend(Run(m.group(0), run.style) for m in _WORD.finditer(run.text))
        else:
            out.append(run)
    fitted: list[Run] = []
    for piece in out:
        markers = 2 * len("".join(piece.style))
        if markers + len(piece.render()) <= budget:
            fitted.append(piece)
            continue
        if piece.kind == "link":
            fitted.extend(_pieces([piece.as_text()], budget))
            continue
        room = budget - markers - (2 if piece.kind == "code" else 0)
        fitted.extend(Run(chunk, piece.style, piece.kind) for chunk in _hard_split(piece.text, room))
    return fitted


def split_line(line: Line, limit: int) -> list[str]:
    """A line too long for one part, cut after a sentence or between words."""
    parts: list[str] = []
    prefix = line.prefix
    pieces = _pieces(line.runs, limit - max(len(line.prefix), len(line.cont_prefix)))
    start = 0
    while start < len(pieces):
        budget = limit - len(prefix)
        end, sentence_end, sentence_len = start, -1, 0
        used = 0
        stack: Style = ()
        while end < len(pieces):
            piece = pieces[end]
            cost = len(transition(stack, piece.style)) + len(piece.render())
            closing = len("".join(piece.style))
            if used + cost + closing > budget:
                break
            used += cost
            stack = piece.style
            end += 1
            if piece.kind == "text" and _SENTENCE_END.search(piece.text):
                sentence_end, sentence_len = end, used
        if end == start:  # cannot happen: _pieces made every piece fit; guard against a loop
            end = start + 1
        elif end < len(pieces) and sentence_end > start and sentence_len * 2 >= budget:
            end = sentence_end
        parts.append(_render_chunk(prefix, pieces[start:end], first=not parts))
        start = end
        prefix = line.cont_prefix
    return parts


def _render_chunk(prefix: str, runs: list[Run], *, first: bool) -> str:
    runs = list(runs)
    if runs and runs[-1].kind == "text":
        runs[-1] = Run(runs[-1].text.rstrip(), runs[-1].style)
    if runs and not first and runs[0].kind == "text":
        runs[0] = Run(runs[0].text.lstrip(), runs[0].style)
    return (prefix + render_runs(runs)).rstrip()
