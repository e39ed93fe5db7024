"""Just enough of the bash lexical grammar to see the commands a command line hides.

``shlex`` splits words but knows nothing of ``$(…)``, backticks, ``$'…'`` quotes,
process substitution, redirections or here-documents, all of which hide commands.
This lexer handles those. It never runs or expands anything: expansions stay as
their source text and the word is marked ``dynamic``, and the bodies of
substitutions are kept as text for the caller to check in turn. Unbalanced quotes
or substitutions raise ``ShellSyntaxError``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_BRACE_GROUP = re.compile(r"\{[^{}]*\}")  # linear: each attempt stops at the next brace
_NAME_START = re.compile(r"[A-Za-z_]")
_NAME_CHARS = re.compile(r"[A-Za-z0-9_]*")
_REDIRECTIONS = ("<<<", "<<-", "<<", "<>", "<&", "<", ">>", ">&", ">|", ">", "&>>", "&>")
_HEREDOC_OPS = ("<<", "<<-")
_SIMPLE_ESCAPES = {
    "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r",
    "t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?",
}  # fmt: skip


class ShellSyntaxError(ValueError):
    """The command line is not well-formed (unbalanced quotes or substitutions)."""


@dataclass
class Word:
    """One shell word: its unquoted value plus what makes it unpredictable."""

    value: str
    raw: str
    quoted: bool = False  # some part was quoted or escaped
    dynamic: bool = False  # contains a $-expansion or a command/process substitution
    pattern: bool = False  # contains unquoted glob or brace-expansion characters
    substitutions: list[str] = field(default_factory=list)  # bodies of $(…), `…`, <(…), >(…)


@dataclass
class Redirect:
    op: str
    target: Word | None = None
    heredoc: str | None = None
    substitutions: list[str] = field(default_factory=list)  # from an unquoted here-document


Token = Word | Redirect | str  # a str is an operator


def find_close(text: str, start: int, opener: str) -> int:
    """Index of the character closing the construct opened just before ``start``."""
    stack = [opener]
    i, n = start, len(text)
    while i < n:
        ch, top = text[i], stack[-1]
        nxt = text[i + 1] if i + 1 < n else ""
        if ch == "\\":
            i += 2
            continue
        if top == '"':
            if ch == '"':
                stack.pop()
            elif ch == "`":
                stack.append("`")
            elif ch == "$" and nxt in ("(", "{"):
                stack.append(nxt)
                i += 1
        elif top == "`":
            if ch == "`":
                stack.pop()
        elif ch == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise ShellSyntaxError("unbalanced single quote")
            i = end
        elif ch == '"' or ch == "`":
            stack.append(ch)
        elif ch == "$" and nxt in ("(", "{"):
            stack.append(nxt)
            i += 1
        elif ch == "(" and top == "(":
            stack.append("(")
        elif (ch == ")" and top == "(") or (ch == "}" and top == "{"):
            stack.pop()
        if not stack:
            return i
        i += 1
    names = {"(": "$( or (", "{": "${", '"': "double quote", "`": "backquote"}
    raise ShellSyntaxError(f"unbalanced {names[stack[-1]]}")


def scan_substitutions(text: str) -> list[str]:
    """Command substitutions in text where quotes are literal (here-documents, ``${…}``)."""
    bodies: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
        elif ch == "$" and text.startswith("$(", i):
            end = find_close(text, i + 2, "(")
            bodies.append(text[i + 2 : end])
            i = end + 1
        elif ch == "`":
            end = _backquote_end(text, i + 1)
            bodies.append(_unescape_backquoted(text[i + 1 : end]))
            i = end + 1
        else:
            i += 1
    return bodies


def _is_pattern(unquoted: str) -> bool:
    """Whether unquoted text would be expanded as a glob (``*``, ``?``, ``[…]``) or braces (``{a,b}``)."""
    if "*" in unquoted or "?" in unquoted:
        return True
    bracket = unquoted.find("[")
    if bracket >= 0 and unquoted.find("]", bracket + 1) >= 0:
        return True
    return any("," in m.group() or ".." in m.group() for m in _BRACE_GROUP.finditer(unquoted))


def _backquote_end(text: str, start: int) -> int:
    i = start
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == "`":
            return i
        i += 1
    raise ShellSyntaxError("unbalanced backquote")


def _unescape_backquoted(body: str) -> str:
    return re.sub(r"\\([$`\\])", r"\1", body)


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.n = len(text)
        self.tokens: list[Token] = []
        self.awaiting_target: Redirect | None = None
        self.heredocs: list[tuple[Redirect, str, bool]] = []  # redirect, delimiter, expands
        self._reset_word()

    def _reset_word(self) -> None:
        self.parts: list[str] = []
        self.unquoted: list[str] = []
        self.start = -1
        self.quoted = self.dynamic = self.pattern = False
        self.subs: list[str] = []

    def _add(self, text: str, pos: int, *, quoted: bool) -> None:
        if self.start < 0:
            self.start = pos
        self.parts.append(text)
        if quoted:
            self.quoted = True
            self.unquoted.append("Q" * len(text))
        else:
            self.unquoted.append(text)

    def _end_word(self, pos: int) -> None:
        if self.start < 0:
            return
        if _is_pattern("".join(self.unquoted)):
            self.pattern = True
        word = Word(
            value="".join(self.parts), raw=self.text[self.start : pos], quoted=self.quoted,
            dynamic=self.dynamic, pattern=self.pattern, substitutions=self.subs,
        )  # fmt: skip
        self._reset_word()
        if self.awaiting_target is not None:
            redirect, self.awaiting_target = self.awaiting_target, None
            redirect.target = word
            if redirect.op in _HEREDOC_OPS:
                self.heredocs.append((redirect, word.value, not word.quoted))
            return
        self.tokens.append(word)

    def _emit(self, token: Token, pos: int) -> None:
        self._end_word(pos)
        self.awaiting_target = None
        self.tokens.append(token)
        if isinstance(token, Redirect):
            self.awaiting_target = token

    def run(self) -> list[Token]:
        pos = 0
        text, n = self.text, self.n
        while pos < n:
            ch = text[pos]
            if ch in " \t\r":
                self._end_word(pos)
                pos += 1
            elif ch == "\n":
                self._emit("\n", pos)
                pos = self._read_heredocs(pos + 1)
            elif ch == "#" and self.start < 0:
                end = text.find("\n", pos)
                pos = n if end < 0 else end
            elif ch == "\\":
                if text.startswith("\\\n", pos):
                    pos += 2
                else:
                    self._add(text[pos + 1 : pos + 2] or "\\", pos, quoted=True)
                    pos += 2
            elif ch == "'":
                end = text.find("'", pos + 1)
                if end < 0:
                    raise ShellSyntaxError("unbalanced single quote")
                self._add(text[pos + 1 : end], pos, quoted=True)
                pos = end + 1
            elif ch == '"':
                pos = self._double_quoted(pos + 1, pos)
            elif ch == "$":
                pos = self._dollar(pos, in_double=False)
            elif ch == "`":
                pos = self._backquoted(pos)
            elif ch in "<>" and text.startswith("(", pos + 1):
                end = find_close(text, pos + 2, "(")
                self.subs.append(text[pos + 2 : end])
                self._add(text[pos : end + 1], pos, quoted=True)
                self.dynamic = True
                pos = end + 1
            elif ch in ";&|()<>":
                pos = self._operator(pos)
            else:
                self._add(ch, pos, quoted=False)
                pos += 1
        self._end_word(n)
        return self.tokens

    def _operator(self, pos: int) -> int:
        text = self.text
        if text[pos] in "<>" or text.startswith(("&>",), pos):
            op = next(o for o in _REDIRECTIONS if text.startswith(o, pos))
            raw = text[self.start : pos] if self.start >= 0 else ""
            if raw.isdigit():  # "2>": the word so far is the file descriptor
                self._reset_word()
            self._emit(Redirect(op=op), pos)
            return pos + len(op)
        for op in (";;&", ";;", ";&", "&&", "||", "|&", ";", "&", "|", "(", ")"):
            if text.startswith(op, pos):
                self._emit(op, pos)
                return pos + len(op)
        raise AssertionError("unreachable")  # pragma: no cover

    def _double_quoted(self, pos: int, start: int) -> int:
        text = self.text
        if self.start < 0:
            self.start = start
        self.quoted = True
        while pos < self.n:
            ch = text[pos]
            if ch == '"':
                return pos + 1
            if ch == "\\":
                nxt = text[pos + 1 : pos + 2]
                if nxt == "\n":
                    pos += 2
                elif nxt and nxt in '$`"\\':
                    self._add(nxt, pos, quoted=True)
                    pos += 2
                else:
                    self._add("\\", pos, quoted=True)
                    pos += 1
            elif ch == "$":
                pos = self._dollar(pos, in_double=True)
            elif ch == "`":
                pos = self._backquoted(pos)
            else:
                self._add(ch, pos, quoted=True)
                pos += 1
        raise ShellSyntaxError("unbalanced double quote")

    def _dollar(self, pos: int, *, in_double: bool) -> int:
        text = self.text
        nxt = text[pos + 1 : pos + 2]
        if nxt == "'" and not in_double:
            return self._ansi_c(pos + 2, pos)
        if nxt == '"' and not in_double:
            return self._double_quoted(pos + 2, pos)
        if nxt in ("(", "{"):
            end = find_close(text, pos + 2, nxt)
            inner = text[pos + 2 : end]
            if nxt == "(":
                self.subs.append(inner)
            else:
                self.subs.extend(scan_substitutions(inner))
            self._add(text[pos : end + 1], pos, quoted=True)
            self.dynamic = True
            return end + 1
        if nxt and _NAME_START.match(nxt):
            m = _NAME_CHARS.match(text, pos + 2)
            end = m.end() if m else pos + 2
        elif nxt and (nxt.isdigit() or nxt in "@*#?$!-"):
            end = pos + 2
        else:
            self._add("$", pos, quoted=in_double)
            return pos + 1
        self._add(text[pos:end], pos, quoted=True)
        self.dynamic = True
        return end

    def _backquoted(self, pos: int) -> int:
        end = _backquote_end(self.text, pos + 1)
        self.subs.append(_unescape_backquoted(self.text[pos + 1 : end]))
        self._add(self.text[pos : end + 1], pos, quoted=True)
        self.dynamic = True
        return end + 1

    def _ansi_c(self, pos: int, start: int) -> int:
        """``$'…'``: decode the escapes; a NUL ends the string, as in bash."""
        text, truncated = self.text, False
        out: list[str] = []
        while pos < self.n:
            ch = text[pos]
            if ch == "'":
                self._add("".join(out), start, quoted=True)
                return pos + 1
            if ch != "\\":
                if not truncated:
                    out.append(ch)
                pos += 1
                continue
            decoded, pos = _ansi_escape(text, pos + 1)
            if decoded == "\x00":
                truncated = True
            elif not truncated:
                out.append(decoded)
        raise ShellSyntaxError("unbalanced $'…' quote")

    def _read_heredocs(self, pos: int) -> int:
        """After a newline: consume the bodies of the here-documents opened on that line."""
        text = self.text
        for redirect, delimiter, expands in self.heredocs:
            lines: list[str] = []
            while pos < self.n:
                end = text.find("\n", pos)
                line = text[pos:] if end < 0 else text[pos:end]
                pos = self.n if end < 0 else end + 1
                if (line.lstrip("\t") if redirect.op == "<<-" else line) == delimiter:
                    break
                lines.append(line)
            redirect.heredoc = "\n".join(lines)
            if expands:
                redirect.substitutions.extend(scan_substitutions(redirect.heredoc))
        self.heredocs = []
        return pos


def _ansi_escape(text: str, pos: int) -> tuple[str, int]:
    """Decode one escape of a ``$'…'`` string starting after the backslash."""
    ch = text[pos : pos + 1]
    if ch in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[ch], pos + 1
    for prefix, digits, base in (("x", 2, 16), ("u", 4, 16), ("U", 8, 16)):
        if ch == prefix:
            m = re.match(rf"[0-9A-Fa-f]{{1,{digits}}}", text[pos + 1 : pos + 1 + digits])
            if not m:
                return "\\" + ch, pos + 1
            code = int(m.group(), base)
            return (chr(code) if code <= 0x10FFFF else "\ufffd"), pos + 1 + m.end()
    m = re.match(r"[0-7]{1,3}", text[pos : pos + 3])
    if m:
        return chr(int(m.group(), 8) & 0xFF), pos + m.end()
    if ch == "c" and pos + 1 < len(text):
        return chr(ord(text[pos + 1]) & 0x1F), pos + 2
    return "\\" + ch, pos + 1


def tokenize(text: str) -> list[Token]:
    """Words (``Word``), redirections (``Redirect``, target attached) and operators (``str``)."""
    return _Lexer(text).run()
