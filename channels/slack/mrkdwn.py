"""Slack mrkdwn as a small document model: styled runs in prefixed lines, grouped in blocks.

The renderer (format.py) builds this model from markdown-it tokens and the splitter
(split.py) cuts it into message parts. Keeping runs structured until the very end is
what lets a part close and reopen bold/italic/strike and code fences at a cut, and it
is the one place where text is escaped: every character of model text goes through
:func:`escape_text`, so ``<!channel>``, ``<@U123>`` and friends can never become live
mentions; the only ``<…>`` sequences in the output are links this module emits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

Style = tuple[str, ...]
RunKind = Literal["text", "code", "link"]

FENCE = "```"
_ZWSP = "\u200b"
_BACKTICK_PAIR = re.compile(r"`(?=`)")
_SAFE_URL = re.compile(r"(?:https?://|mailto:)[^\s<>|`]+", re.IGNORECASE)


def escape_text(raw: str) -> str:
    """Escape the three control characters of mrkdwn and break up backtick runs.

    A zero-width space between consecutive backticks keeps model text from opening or
    closing a code fence.
    """
    escaped = raw.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _BACKTICK_PAIR.sub("`" + _ZWSP, escaped)


def escape_inline_code(raw: str) -> str:
    """Inline code cannot contain a backtick in Slack; a look-alike keeps the text readable."""
    return escape_text(raw.replace("`", "ˋ")).replace("\n", " ")


def safe_url(url: str) -> str | None:
    """The URL when it may be linked (http, https, mailto; nothing that could end ``<…>``)."""
    url = url.strip()
    return url if _SAFE_URL.fullmatch(url) else None


@dataclass(frozen=True)
class Run:
    """A piece of inline content; ``text`` is raw (unescaped) model text."""

    text: str
    style: Style = ()
    kind: RunKind = "text"
    url: str = ""  # raw, already checked with safe_url, for kind "link"

    def render(self) -> str:
        if self.kind == "code":
            return "`" + escape_inline_code(self.text) + "`"
        if self.kind == "link":
            url = self.url.replace("&", "&amp;")
            label = self.text.replace("\n", " ").strip()
            if not label or label == self.url:
                return f"<{url}>"
            return f"<{url}|{escape_text(label)}>"
        return escape_text(self.text)

    def as_text(self) -> Run:
        """The same content as plain text (for a link too long to keep whole)."""
        if self.kind != "link":
            return Run(self.text, self.style, "text")
        label = self.text.strip()
        text = self.url if not label or label == self.url else f"{label} ({self.url})"
        return Run(text, self.style, "text")


def _common_prefix(a: Style, b: Style) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def transition(current: Style, target: Style) -> str:
    """The markers that close what ``target`` lacks and open what it adds (properly nested)."""
    keep = _common_prefix(current, target)
    closing = "".join(reversed(current[keep:]))
    opening = "".join(target[keep:])
    return closing + opening


def render_runs(runs: list[Run]) -> str:
    """Runs to mrkdwn with balanced style markers."""
    out: list[str] = []
    stack: Style = ()
    for run in runs:
        if not run.text and run.kind != "link":
            continue
        out.append(transition(stack, run.style))
        out.append(run.render())
        stack = run.style
    out.append(transition(stack, ()))
    return "".join(out)


@dataclass
class Line:
    """One output line; ``cont_prefix`` starts the rest of the line when it is cut."""

    prefix: str
    runs: list[Run] = field(default_factory=list)
    cont_prefix: str = ""

    def render(self) -> str:
        return (self.prefix + render_runs(self.runs)).rstrip()


@dataclass
class TextBlock:
    """A paragraph, heading, list item paragraph, quote paragraph or rule."""

    lines: list[Line]
    sep: str = "\n\n"

    def render(self) -> str:
        return "\n".join(line.render() for line in self.lines)


@dataclass
class CodeBlock:
    """A fenced or indented code block; ``lines`` are raw code lines."""

    lines: list[str]
    prefix: str = ""
    sep: str = "\n\n"

    def opener(self) -> str:
        return self.prefix + FENCE + "\n"

    def closer(self) -> str:
        return "\n" + self.prefix + FENCE

    def render_line(self, raw: str) -> str:
        return self.prefix + escape_text(raw)

    def render(self) -> str:
        body = "\n".join(self.render_line(line) for line in self.lines)
        return self.opener() + body + self.closer()


Block = TextBlock | CodeBlock
