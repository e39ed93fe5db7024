"""Telegram's HTML parse mode, checked as strictly as the Bot API does.

Used by the fake Bot API to reject what Telegram would reject with
"Bad Request: can't parse entities: ...": unknown tags, unclosed or mismatched tags,
a bare ``<`` or ``&``, attributes on tags that take none, and entities that Telegram
does not allow to nest (``code``/``pre`` inside other styles, nested blockquotes).
"""

from __future__ import annotations

import html
import re

SUPPORTED = {
    "b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span", "tg-spoiler",
    "a", "code", "pre", "blockquote", "tg-emoji",
}
# Styles that may wrap anything except code/pre.
INLINE_STYLES = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span", "tg-spoiler"}

_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]*)((?:\s+[A-Za-z-]+\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s>]+))*)\s*(/?)>")
_ATTR = re.compile(r"([A-Za-z-]+)\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^\s>]+))")
_ENTITY = re.compile(r"&(?:lt|gt|amp|quot|#[0-9]+|#[xX][0-9a-fA-F]+);")


class TelegramHTMLError(ValueError):
    """What Telegram would say after "can't parse entities: "."""


def parse_telegram_html(text: str) -> str:
    """Validate Telegram HTML and return its visible text."""
    out: list[str] = []
    stack: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "<":
            m = _TAG.match(text, i)
            if m is None:
                raise TelegramHTMLError(f"Unsupported start tag at byte offset {_offset(text, i)}")
            closing, name, attrs, _self_closing = m.group(1), m.group(2).lower(), m.group(3), m.group(4)
            if name not in SUPPORTED:
                raise TelegramHTMLError(f'Unsupported start tag "{name}" at byte offset {_offset(text, i)}')
            if closing:
                if not stack or stack[-1] != name:
                    raise TelegramHTMLError(
                        f'Unmatched end tag at byte offset {_offset(text, i)}, expected "</{stack[-1] if stack else ""}>", found "</{name}>"'
                    )
                stack.pop()
            else:
                _check_open(name, dict(_attrs(attrs)), stack, _offset(text, i))
                stack.append(name)
            i = m.end()
        elif ch == "&":
            m = _ENTITY.match(text, i)
            if m is None:
                raise TelegramHTMLError(f"Unsupported entity at byte offset {_offset(text, i)}")
            out.append(html.unescape(m.group()))
            i = m.end()
        elif ch == ">":
            raise TelegramHTMLError(f"Unexpected '>' at byte offset {_offset(text, i)}")
        else:
            out.append(ch)
            i += 1
    if stack:
        raise TelegramHTMLError(f'Can\'t find end tag corresponding to start tag "{stack[-1]}"')
    return "".join(out)


def _attrs(raw: str) -> list[tuple[str, str]]:
    return [
        (m.group(1).lower(), html.unescape(next(g for g in m.groups()[1:] if g is not None)))
        for m in _ATTR.finditer(raw)
    ]


def _check_open(name: str, attrs: dict[str, str], stack: list[str], offset: int) -> None:
    if name == "a":
        if "href" not in attrs:
            raise TelegramHTMLError(f"Tag \"a\" must have attribute \"href\" at byte offset {offset}")
        if not re.match(r"^(?:https?|tg|ftp)://|^mailto:|^tg:", attrs["href"], re.IGNORECASE):
            raise TelegramHTMLError(f"Wrong URL host in tag \"a\" at byte offset {offset}")
    elif name == "code":
        extra = set(attrs) - {"class"}
        if extra or (attrs.get("class") and (not stack or stack[-1] != "pre")):
            raise TelegramHTMLError(f"Unsupported attribute in tag \"code\" at byte offset {offset}")
    elif attrs and name not in ("span", "tg-emoji", "blockquote"):
        raise TelegramHTMLError(f"Tag \"{name}\" must not have attributes at byte offset {offset}")
    parent = stack[-1] if stack else ""
    code_in_pre = name == "code" and parent == "pre"
    inside_other = any(s in INLINE_STYLES or s in ("a", "code", "pre") for s in stack)
    if name in ("code", "pre") and inside_other and not code_in_pre:
        raise TelegramHTMLError(f"Entity \"{name}\" can't be nested at byte offset {offset}")
    if name == "blockquote" and "blockquote" in stack:
        raise TelegramHTMLError(f"Entity \"blockquote\" can't be nested at byte offset {offset}")
    if parent == "code" or (parent == "pre" and name != "code"):
        raise TelegramHTMLError(f"Entity \"{name}\" can't be inside a code entity at byte offset {offset}")


def _offset(text: str, index: int) -> int:
    return len(text[:index].encode("utf-8"))
