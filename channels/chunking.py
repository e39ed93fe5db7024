"""Boundary-aware splitting of long text into parts that fit a platform's message limit.

Chat platforms cap a message's length (Telegram: 4096 UTF-16 code units, Slack: a few
thousand characters), so a long answer goes out as several messages. Cutting at the
limit blindly breaks words and sentences; here a cut prefers, in order, a paragraph
break, a line break, the end of a sentence, a space, and only then the hard limit.

The exact property of :func:`split_text`: ``"".join(parts) == text``, no part is
empty and ``measure(part) <= limit`` for every part. Separators stay at the end of
the part before the cut, so nothing is lost or added; callers that post each part
as its own message may strip the surrounding whitespace.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

Measure = Callable[[str], int]

# A cut must leave the part at least this full to count in the first, strict pass;
# otherwise a paragraph break near the start would produce a tiny part.
MIN_FILL = 0.5

_BOUNDARIES: tuple[re.Pattern[str], ...] = (
    re.compile(r"\n[ \t]*\n\s*"),  # paragraph: a blank line (and what follows it)
    re.compile(r"\n\s*"),  # line
    re.compile(r"[.!?…。！？]+[\"'”’)\]]*\s+"),  # sentence end followed by whitespace
    re.compile(r"\s+"),  # word
)

_JOINERS = {"\u200d", "\ufe0e", "\ufe0f"}


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, the unit Telegram counts message length in."""
    return len(text.encode("utf-16-le")) // 2


def find_break(window: str, *, following: str = "", min_fill: float = MIN_FILL) -> int:
    """Where to cut ``window`` (which is too long as a whole): an index in ``1..len(window)``.

    The part is ``window[:i]``. Boundaries are tried by preference; the first pass
    accepts a boundary only past ``min_fill`` of the window, the second any boundary
    (a short part beats a broken word), and the last resort is the whole window, moved
    back so it does not split a character from its combining marks (``following`` is
    the text right after the window, to see what the cut would separate).
    """
    size = len(window)
    if size == 0:
        raise ValueError("cannot break an empty window")
    threshold = max(1, int(size * min_fill))
    best_any = 0
    for pattern in _BOUNDARIES:
        end = _last_boundary(pattern, window)
        if end >= threshold:
            return end
        best_any = max(best_any, end)
    if best_any > 0:
        return best_any
    return _safe_hard_cut(window + following[:1], size)


def _last_boundary(pattern: re.Pattern[str], window: str) -> int:
    """End of the last separator match that leaves text before it (0 if none)."""
    last = 0
    for match in pattern.finditer(window):
        if match.start() > 0:
            last = match.end()
    return last


def _safe_hard_cut(text: str, cut: int) -> int:
    """Move a hard cut back so it does not split a combining sequence, a ZWJ sequence or CRLF."""
    while 1 < cut < len(text):
        nxt, prev = text[cut], text[cut - 1]
        if unicodedata.combining(nxt) or nxt in _JOINERS or prev == "\u200d" or (prev == "\r" and nxt == "\n"):
            cut -= 1
            continue
        break
    return cut


def max_fit(text: str, start: int, limit: int, measure: Measure = len) -> int:
    """The largest ``end`` such that ``measure(text[start:end]) <= limit`` (``start`` if none).

    ``measure`` must be monotone in the length of its argument (true for ``len`` and
    :func:`utf16_len`); the search gallops then bisects, so it never measures much more
    than one part's worth of text.
    """
    n = len(text)
    if measure is len:
        return min(n, start + limit)
    if start >= n:
        return n
    good, step = start, max(1, limit)
    bad: int | None = None
    while True:
        probe = min(n, good + step)
        if measure(text[start:probe]) <= limit:
            good = probe
            if probe == n:
                return n
            step *= 2
        else:
            bad = probe
            break
    lo, hi = good, bad
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if measure(text[start:mid]) <= limit:
            lo = mid
        else:
            hi = mid
    return lo


def split_text(text: str, limit: int, measure: Measure = len) -> list[str]:
    """Split ``text`` into parts of at most ``limit`` (by ``measure``) on natural boundaries.

    Returns ``[]`` for empty text. Raises :class:`ValueError` when ``limit`` is not
    positive or a single character is longer than ``limit``.
    """
    if limit < 1:
        raise ValueError(f"limit must be positive, got {limit}")
    parts: list[str] = []
    start, n = 0, len(text)
    while start < n:
        end = max_fit(text, start, limit, measure)
        if end >= n:
            parts.append(text[start:])
            break
        if end == start:
            raise ValueError(f"the character at {start} alone exceeds the limit of {limit}")
        cut = start + find_break(text[start:end], following=text[end : end + 1])
        parts.append(text[start:cut])
        start = cut
    return parts
