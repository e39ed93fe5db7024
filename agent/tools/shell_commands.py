"""Group shell tokens into the simple commands a command line would run.

The split is on ``;``, ``&``, ``&&``, ``||``, ``|``, ``|&``, newlines, ``( )``,
``{ }`` and the compound keywords (``if``, ``while``, ``for``, ``case`` …). It is
deliberately loose about grammar: whatever stands at a command position is
treated as a command, so a misreading makes the caller see more commands, not
fewer. Each command records whether its stdin comes from a pipe, including from
a pipe into an enclosing group (``curl … | (cat; sh)``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent.tools.shell_syntax import Redirect, Token, Word, tokenize

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")
_SEPARATORS = {";", "&", "&&", "||", "\n", ";;", ";&", ";;&"}
_OPENERS = {"if", "while", "until", "for", "select", "case", "{"}
_CLOSERS = {"fi", "done", "esac", "}"}
_PREFIX_KEYWORDS = {"!", "then", "else", "elif", "do"}


@dataclass
class Command:
    """A simple command: assignments, words and redirections, plus where its stdin comes from."""

    words: list[Word] = field(default_factory=list)
    assignments: list[Word] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)
    piped_in: bool = False  # stdin is (part of) a pipe
    pipe_from: Command | None = None  # the simple command piped directly into this one


@dataclass
class Script:
    commands: list[Command]
    words: list[Word]  # every word, including those that are not commands (for-lists, case patterns)
    redirects: list[Redirect]

    def substitutions(self) -> list[str]:
        """The bodies of every command and process substitution, in source order."""
        bodies = [body for word in self.words for body in word.substitutions]
        for redirect in self.redirects:
            bodies.extend(redirect.substitutions)
            if redirect.target is not None:
                bodies.extend(redirect.target.substitutions)
        return bodies


class _Parser:
    def __init__(self) -> None:
        self.commands: list[Command] = []
        self.words: list[Word] = []
        self.redirects: list[Redirect] = []
        self.current: Command | None = None
        self.last_finished: Command | None = None
        self.pipe_pending = False
        self.pipe_source: Command | None = None
        self.groups: list[bool] = []  # per open group: is its stdin a pipe?
        self.mode = "command"  # command | list (for/select words) | case_word | case_pattern | name

    def _piped(self) -> bool:
        return self.pipe_pending or (self.groups[-1] if self.groups else False)

    def _open_group(self) -> None:
        self.groups.append(self._piped())
        self.pipe_pending = False
        self.pipe_source = None

    def _close_group(self) -> None:
        if self.groups:
            self.groups.pop()

    def _finish(self) -> None:
        self.last_finished = None
        if self.current is not None and (
            self.current.words or self.current.assignments or self.current.redirects
        ):
            self.commands.append(self.current)
            self.last_finished = self.current
        self.current = None

    def _start(self) -> Command:
        if self.current is None:
            self.current = Command(
                piped_in=self._piped(), pipe_from=self.pipe_source if self.pipe_pending else None
            )
            self.pipe_pending = False
            self.pipe_source = None
        return self.current

    def operator(self, op: str) -> None:
        if self.mode == "case_pattern":
            if op == ")":
                self.mode = "command"
            return
        self._finish()
        if op in ("|", "|&"):
            self.pipe_pending = True
            self.pipe_source = self.last_finished
            return
        if op == "(":
            self._open_group()
            return
        self.pipe_pending = False
        self.pipe_source = None
        if op == ")":
            self._close_group()
        elif op in (";;", ";&", ";;&"):
            self.mode = "case_pattern"
        elif self.mode == "list":
            self.mode = "command"

    def word(self, word: Word) -> None:
        self.words.append(word)
        keyword = word.value if not word.quoted else ""
        if self.mode == "list":
            return
        if self.mode == "name":
            self.mode = "command"
            return
        if self.mode == "case_word":
            if keyword == "in":
                self.mode = "case_pattern"
            return
        if self.mode == "case_pattern":
            if keyword == "esac":
                self._close_group()
                self.mode = "command"
            return
        at_start = self.current is None or not self.current.words
        if at_start and keyword and self._keyword(keyword):
            return
        command = self._start()
        if not command.words and _ASSIGNMENT.match(word.raw):
            command.assignments.append(word)
            return
        command.words.append(word)

    def _keyword(self, keyword: str) -> bool:
        """Handle a reserved word at a command position; False when it is an ordinary word."""
        if keyword in _PREFIX_KEYWORDS:
            return True
        if keyword in _OPENERS:
            self._finish()
            self._open_group()
            self.mode = {"for": "list", "select": "list", "case": "case_word"}.get(keyword, "command")
            return True
        if keyword in _CLOSERS:
            self._finish()
            self._close_group()
            return True
        if keyword == "function":
            self.mode = "name"
            return True
        return False

    def redirect(self, redirect: Redirect) -> None:
        self.redirects.append(redirect)
        if self.mode in ("command", "name"):
            self._start().redirects.append(redirect)

    def script(self) -> Script:
        self._finish()
        return Script(commands=self.commands, words=self.words, redirects=self.redirects)


def parse(text: str) -> Script:
    """The simple commands of a command line; raises ``ShellSyntaxError`` when it cannot be read."""
    parser = _Parser()
    token: Token
    for token in tokenize(text):
        if isinstance(token, Word):
            parser.word(token)
        elif isinstance(token, Redirect):
            parser.redirect(token)
        else:
            parser.operator(token)
    return parser.script()
