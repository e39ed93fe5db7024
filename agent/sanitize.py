"""Clean model output before anyone sees it, and recognise the silent-reply tokens.

Models leak scaffolding into their text: garbled tool-call XML, tool calls
"downgraded" to prose, thinking blocks, ``<final>`` wrappers, echoed system
blocks and repeated paragraphs. :func:`sanitize` removes them in a fixed order
(the steps of the shared cases README). :func:`is_silent_chat`,
:func:`is_silent_cron` and :func:`heartbeat_reply` decide whether a reply is
delivered at all.

Everything here runs in linear time on hostile input: tags are found with
regexes that start with a literal ``<`` and have no nested quantifiers, and the
searches for ``>`` and for closing tags are cached so no region of the text is
scanned more than a constant number of times.

``sanitize`` is not idempotent in general: removing one construct can make the
text around it form another one that an earlier step would have removed (for
example ``<think>x</think>[Tool Call: f]`` leaves a ``[Tool Call:`` line behind).
What holds for every input: the result is a subsequence of the input, so
repeating ``sanitize`` reaches a fixed point; and once the result contains no
``<`` and no ``[``, applying ``sanitize`` again changes nothing.
"""

from __future__ import annotations

import re
from typing import Final

# Every character str.isspace() accepts (the same set as \s in a str regex), so that
# str.strip(chars) can trim "whitespace and wrapper characters" in one C-level pass.
WHITESPACE: Final[str] = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
WRAPPERS: Final[str] = "_.,:;!?\"'`*~#>-()[]{}"
_TRIM: Final[str] = WHITESPACE + WRAPPERS

SILENT_TOKEN: Final[str] = "NO_REPLY"
HEARTBEAT_TOKEN: Final[str] = "HEARTBEAT_OK"
HEARTBEAT_MAX_ACK_CHARS: Final[int] = 300

# A candidate tag start: "<" or "</" and a name. Names longer than 40 are no tag we know.
_TAG_START: Final = re.compile(r"<(/?)([A-Za-z0-9_:.\-]{1,40})")

# --- step 1: garbled tool-call XML -------------------------------------------------

_TOOL_XML_TRIGGERS: Final[tuple[str, ...]] = (
    "invfunction_calls",
    "functioninvoke",
    "<parameter name=",
    "</parameter",
    "<function_call",
    "<tool_call",
    "<tool_use",
    "<minimax:tool_call",
)
_TOOL_XML_NAMES: Final[frozenset[str]] = frozenset(
    {
        "function_call",
        "function_calls",
        "functioninvoke",
        "invoke",
        "invfunction_calls",
        "tool_call",
        "tool_use",
        "parameter",
        "minimax:tool_call",
    }
)


def _strip_tool_xml(text: str) -> str:
    """Remove garbled tool-call tags (names are case-sensitive), keeping the text between them."""
    lower = text.lower()
    if not any(trigger in lower for trigger in _TOOL_XML_TRIGGERS):
        return text
    out: list[str] = []
    pos = 0
    gt = -2  # cached index of the next ">" at or after the last query; -1: there is none
    n = len(text)
    for m in _TAG_START.finditer(text):
        start = m.start()
        if start < pos or m.group(2) not in _TOOL_XML_NAMES:
            continue
        after = m.end()
        if after < n and text[after] == ">":
            end = after + 1
        elif after < n and (text[after].isspace() or text[after] == "/"):
            if gt != -1 and gt < after:
                gt = text.find(">", after)
            if gt == -1:
                break  # no ">" anywhere after this point: no further tag can be complete
            end = gt + 1
        else:
            continue
        out.append(text[pos:start])
        pos = end
    out.append(text[pos:])
    cleaned = "".join(out)
    return "" if not cleaned.strip() else cleaned


# --- step 2: downgraded tool text ---------------------------------------------------

_DOWNGRADED_STARTS: Final[tuple[str, ...]] = ("[Tool Call:", "[Tool Result", "[Historical context:")
_DOWNGRADED_BODY_STARTS: Final[tuple[str, ...]] = ("Arguments:", "{", "}")


def _strip_downgraded_tool_text(text: str) -> str:
    """Drop ``[Tool Call: …]``-style lines with their blank / Arguments / JSON lines."""
    if not any(marker in text for marker in _DOWNGRADED_STARTS):
        return text
    kept: list[str] = []
    in_block = False
    for line in text.split("\n"):
        trimmed = line.strip()
        if trimmed.startswith(_DOWNGRADED_STARTS):
            in_block = True
            continue
        if in_block:
            if not trimmed or trimmed.startswith(_DOWNGRADED_BODY_STARTS):
                continue
            in_block = False
        kept.append(line)
    return "\n".join(kept)


# --- step 3: thinking blocks --------------------------------------------------------

_THINKING_NAMES: Final[tuple[str, ...]] = ("redacted_thinking", "thinking", "think", "thought", "antthinking")


def _ascii_caseless(word: str) -> str:
    """A regex for ``word`` in any ASCII case (no IGNORECASE: it keeps the literal prefix fast)."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


_THINKING_CLOSE: Final[dict[str, re.Pattern[str]]] = {
    name: re.compile(r"</" + _ascii_caseless(name) + r"\s*+>") for name in _THINKING_NAMES
}


def _strip_thinking(text: str) -> str:
    """Remove ``<X …>…</X>`` blocks; each opening tag ends at the next closing tag of its name."""
    if "<" not in text:
        return text
    out: list[str] = []
    pos = 0
    n = len(text)
    gt = -2
    # name -> (searched from, match start, match end); start == -1: none at or after "from"
    closes: dict[str, tuple[int, int, int]] = {}
    for m in _TAG_START.finditer(text):
        start = m.start()
        if start < pos or m.group(1):
            continue
        name = m.group(2).lower()
        if name not in _THINKING_CLOSE:
            continue
        after = m.end()
        if after < n and text[after] == ">":
            body = after + 1
        elif after < n and text[after].isspace():
            if gt != -1 and gt < after:
                gt = text.find(">", after)
            if gt == -1:
                continue
            body = gt + 1
        else:
            continue
        cached = closes.get(name)
        if cached is None or (cached[1] != -1 and cached[1] < body) or (cached[1] == -1 and cached[0] > body):
            found = _THINKING_CLOSE[name].search(text, body)
            cached = (body, found.start(), found.end()) if found else (body, -1, -1)
            closes[name] = cached
        if cached[1] == -1:
            continue  # an opening tag without a closing tag stays as it is
        out.append(text[pos:start])
        pos = cached[2]
    out.append(text[pos:])
    return "".join(out)


# --- step 4: <final> wrappers -------------------------------------------------------

_FINAL_TAG: Final = re.compile(r"<\s*+/?\s*+" + _ascii_caseless("final") + r"\s*+>")


def _strip_final_tags(text: str) -> str:
    return _FINAL_TAG.sub("", text) if "<" in text else text


# --- step 5: echoed system blocks ---------------------------------------------------


def _strip_echoed_system(text: str) -> str:
    """Drop a ``[System Message]`` line and the lines after it up to and including a blank one."""
    if "[System Message]" not in text:
        return text
    kept: list[str] = []
    in_block = False
    for line in text.split("\n"):
        if in_block:
            if not line.strip():
                in_block = False
            continue
        if line.lstrip().startswith("[System Message]"):
            in_block = True
            continue
        kept.append(line)
    return "\n".join(kept)


# --- step 6: consecutive duplicate paragraphs -----------------------------------------


def _collapse_duplicate_paragraphs(text: str) -> str:
    if "\n\n" not in text:
        return text
    kept: list[str] = []
    last = None
    for paragraph in text.split("\n\n"):
        trimmed = paragraph.strip()
        if not trimmed or trimmed == last:
            continue
        kept.append(paragraph)
        last = trimmed
    return "\n\n".join(kept)


_SURROGATE = re.compile("[\ud800-\udfff]")


def well_formed(text: str) -> str:
    """``text`` as valid Unicode: a surrogate pair (JSON's ``\\ud83d\\ude00`` escapes decoded
    one by one) joined into its character, a lone surrogate replaced by U+FFFD. Markdown
    parsers and every platform's UTF-8 encoder refuse them, and model text may hold them."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def sanitize(text: str) -> str:
    """Remove model scaffolding from ``text`` (shared cases README, "Sanitize", steps 1-7)."""
    if not text:
        return ""
    text = _strip_tool_xml(text)
    if not text:
        return ""
    text = _strip_downgraded_tool_text(text)
    text = _strip_thinking(text)
    text = _strip_final_tags(text)
    text = _strip_echoed_system(text)
    text = _collapse_duplicate_paragraphs(text)
    return text.strip()


# --- silent replies -----------------------------------------------------------------


def _is_ascii_alnum(char: str) -> bool:
    return char.isascii() and char.isalnum()


def is_silent_chat(text: str) -> bool:
    """True when the reply, trimmed of whitespace and wrapper characters, starts with NO_REPLY."""
    core = text.strip(_TRIM)
    head = core[: len(SILENT_TOKEN)]
    if not head.isascii() or head.upper() != SILENT_TOKEN:
        return False
    return len(core) == len(SILENT_TOKEN) or not _is_ascii_alnum(core[len(SILENT_TOKEN)])


_SILENT_ANYWHERE: Final = re.compile(r"(?<![A-Za-z0-9])" + _ascii_caseless(SILENT_TOKEN) + r"(?![A-Za-z0-9])")


def is_silent_cron(text: str) -> bool:
    """True when NO_REPLY (any case) appears anywhere, not glued to an ASCII letter or digit."""
    return _SILENT_ANYWHERE.search(text) is not None


def heartbeat_reply(text: str) -> str | None:
    """What to deliver for a heartbeat reply; ``None`` when it is only an acknowledgement.

    A ``HEARTBEAT_OK`` at the start or end (behind whitespace and wrapper characters only)
    is removed with everything between it and that end; if at most 300 characters remain
    the reply is dropped, otherwise the rest is delivered.
    """
    token = HEARTBEAT_TOKEN
    size = len(token)
    n = len(text)
    first = n - len(text.lstrip(_TRIM))
    last_end = len(text.rstrip(_TRIM))
    at_start = text.startswith(token, first) and (
        first + size == n or not _is_ascii_alnum(text[first + size])
    )
    end_start = last_end - size
    at_end = (
        end_start >= 0
        and text.startswith(token, end_start)
        and (end_start == 0 or not _is_ascii_alnum(text[end_start - 1]))
    )
    if not at_start and not at_end:
        return text
    rest_from = 0
    rest_to = n
    if at_start:
        tail = text[first + size :]
        rest_from = n - len(tail.lstrip(WRAPPERS))
    if at_end:
        rest_to = len(text[:end_start].rstrip(WRAPPERS))
    rest = text[rest_from:rest_to] if rest_from < rest_to else ""
    if len(rest.strip(_TRIM)) <= HEARTBEAT_MAX_ACK_CHARS:
        return None
    return rest.strip()
