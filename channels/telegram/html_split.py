"""Split Telegram HTML into messages that fit the length limit without breaking markup.

The markup is cut into indivisible units (a tag, an entity, one character), so a cut
never lands inside a tag or an entity. Each part closes the tags still open at its
end and the next part reopens them (with their attributes, e.g. ``<a href>`` or
``<pre><code class="language-x">``), so every part is balanced on its own.

Where to cut is decided on the visible text by :func:`channels.chunking.find_break`
(paragraph, line, sentence, word, then hard). A part's length counts the markup as
well as the text, so every part is within the limit however it is measured.

Properties (tested): every part measures at most ``limit``; every part is balanced;
the visible texts of the parts, joined, equal the visible text of the input.
"""

from __future__ import annotations

import html
import re
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate

from channels.chunking import Measure, find_break, utf16_len

_UNIT = re.compile(r"<[^>]*>|&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);|[^<&]+|[<&]")
_TAG_NAME = re.compile(r"</?\s*([A-Za-z][A-Za-z0-9-]*)")

TEXT, OPEN, CLOSE = 0, 1, 2


@dataclass
class _Units:
    raw: list[str]
    kind: list[int]
    name: list[str]  # tag name for OPEN/CLOSE, "" for text
    visible: list[str]  # the character a text unit shows, "" for tags
    size: list[int]  # measure() of raw


def _tokenize(markup: str, measure: Measure) -> _Units:
    units = _Units([], [], [], [], [])
    for match in _UNIT.finditer(markup):
        piece = match.group()
        if piece.startswith("<") and len(piece) > 1 and piece.endswith(">"):
            tag = _TAG_NAME.match(piece)
            if tag is None:
                raise ValueError(f"unparseable tag {piece[:40]!r}")
            closing = piece.startswith("</")
            units.raw.append(piece)
            units.kind.append(CLOSE if closing else OPEN)
            units.name.append(tag.group(1).lower())
            units.visible.append("")
            units.size.append(measure(piece))
        elif piece.startswith("&") and len(piece) > 1:
            units.raw.append(piece)
            units.kind.append(TEXT)
            units.name.append("")
            units.visible.append(html.unescape(piece))
            units.size.append(measure(piece))
        else:
            chars = list(piece)
            units.raw.extend(chars)
            units.kind.extend([TEXT] * len(chars))
            units.name.extend([""] * len(chars))
            units.visible.extend(chars)
            if measure is utf16_len:
                units.size.extend([2 if ord(ch) > 0xFFFF else 1 for ch in chars])
            else:
                units.size.extend(measure(ch) for ch in chars)
    return units


def _drop_empty_elements(units: _Units) -> _Units:
    """Remove elements that enclose nothing (``<b></b>``, also nested): they show nothing."""
    keep: list[int] = []
    for j, kind in enumerate(units.kind):
        if kind == CLOSE and keep and units.kind[keep[-1]] == OPEN and units.name[keep[-1]] == units.name[j]:
            keep.pop()
            continue
        keep.append(j)
    if len(keep) == len(units.raw):
        return units
    return _Units(
        [units.raw[j] for j in keep], [units.kind[j] for j in keep], [units.name[j] for j in keep],
        [units.visible[j] for j in keep], [units.size[j] for j in keep],
    )


def split_html(markup: str, limit: int, measure: Measure = utf16_len) -> list[str]:
    """Split balanced HTML into balanced parts of at most ``limit``.

    Elements that enclose no text at all (e.g. ``<b></b>``) are dropped.
    Raises :class:`ValueError` if ``limit`` is not positive, if the markup is not
    balanced, or if the tags open at some point are so long that not even one
    character fits beside them.
    """
    if limit < 1:
        raise ValueError(f"limit must be positive, got {limit}")
    units = _drop_empty_elements(_tokenize(markup, measure))
    n = len(units.raw)
    last_text = next((j for j in range(n - 1, -1, -1) if units.kind[j] == TEXT), -1)
    parts: list[str] = []
    stack: list[tuple[str, str]] = []  # (name, opening tag) open at the current position
    i = 0
    while i < n:
        # Closing tags right at a cut belong to the previous part: skip, don't reopen.
        while i < n and units.kind[i] == CLOSE:
            _pop(stack, units.name[i])
            i += 1
        if i > last_text:
            # Only markup without any text is left (e.g. an empty "<b></b>"): nothing to show.
            for j in range(i, n):
                if units.kind[j] == OPEN:
                    stack.append((units.name[j], units.raw[j]))
                elif units.kind[j] == CLOSE:
                    _pop(stack, units.name[j])
            break
        fit = _last_fit(units, i, stack, limit, measure)
        cut = n if fit == n else _choose_cut(units, i, fit)
        prefix = "".join(tag for _, tag in stack)
        body = "".join(units.raw[i:cut])
        for j in range(i, cut):
            if units.kind[j] == OPEN:
                stack.append((units.name[j], units.raw[j]))
            elif units.kind[j] == CLOSE:
                _pop(stack, units.name[j])
        suffix = "".join(f"</{name}>" for name, _ in reversed(stack))
        parts.append(prefix + body + suffix)
        i = cut
    if stack:
        raise ValueError(f"unbalanced markup: <{stack[-1][0]}> is never closed")
    return parts


def _pop(stack: list[tuple[str, str]], name: str) -> None:
    if not stack or stack[-1][0] != name:
        raise ValueError(f"unbalanced markup: </{name}> does not close the open tag")
    stack.pop()


def _last_fit(units: _Units, start: int, stack: list[tuple[str, str]], limit: int, measure: Measure) -> int:
    """The furthest unit index a part starting at ``start`` may end at.

    The total (reopened tags + units + closing tags) never decreases as the part grows
    (a closing tag moves its length from the suffix into the body), so the scan stops
    at the first unit that does not fit.
    """
    names = [name for name, _ in stack]
    total = sum(measure(tag) for _, tag in stack) + sum(measure(f"</{name}>") for name in names)
    last_ok, seen_text = start, False
    n = len(units.raw)
    j = start
    while j < n:
        kind = units.kind[j]
        if kind == OPEN:
            total += units.size[j] + measure(f"</{units.name[j]}>")
        elif kind == TEXT:
            total += units.size[j]
        # a CLOSE moves its own length from the suffix to the body: no change
        if total > limit:
            break
        j += 1
        if kind == TEXT:
            seen_text = True
        if seen_text:
            last_ok = j
    if last_ok == start:
        raise ValueError(f"markup open at unit {start} leaves no room for text within {limit}")
    return last_ok


def _choose_cut(units: _Units, start: int, fit: int) -> int:
    """Pick a cut in ``(start, fit]`` on the best boundary of the visible text."""
    text_index = [j for j in range(start, fit) if units.kind[j] == TEXT]
    shown = [units.visible[j] for j in text_index]
    ends = list(accumulate(len(s) for s in shown))  # an entity may show more than one character
    following = next((units.visible[j] for j in range(fit, len(units.raw)) if units.kind[j] == TEXT), "")
    k = find_break("".join(shown), following=following)
    cut = text_index[bisect_left(ends, k)] + 1
    # Keep closing tags that directly follow the last character in this part.
    while cut < fit and units.kind[cut] == CLOSE:
        cut += 1
    return cut
