"""The bash blocklist: refuse command lines that would run destructive or privileged programs.

Defence in depth, not a sandbox. A determined program can still do damage (a
script file, an interpreter calling ``unlink``); the blocklist stops the common
and the careless cases before anything runs. Every simple command of the line is
checked: through pipes and lists, subshells and groups, ``$(…)``, backticks and
process substitutions, ``bash -c``/``sh -c``/``eval``/``trap``/``watch`` strings,
here-documents and process substitutions fed to a shell, and wrappers (``env``, ``nice``, ``timeout``,
``xargs``, ``find -exec`` …) whose every later word is treated as a possible
command. Quoting tricks are undone by the lexer (``\\rm``, ``'rm'``, ``"r"m``,
``$'\\x72m'``) and paths are reduced to the program name (``/bin/rm``). A command
name that is only known at run time (``$x``, ``$(…)``, globs, brace expansion)
is refused, as is a line that cannot be parsed. When unsure, refuse.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.tools.command_rules import (
    ARGUMENT_RULES,
    CODE_CALL,
    CODE_OPTIONS,
    DEVICE,
    INTERPRETER,
    OPAQUE_SOURCES,
    OUTPUT_REDIRECTS,
    RUNS_STRINGS,
    SHELL_VALUE_OPTIONS,
    SHELLS,
    STDIN_PATHS,
    STRING_RUNNERS,
    WRAPPERS,
    BlockedCommandError,
    blocked,
    blocked_reason,
    check_arguments,
    program_name,
    scan_text,
)
from agent.tools.shell_commands import Command, parse
from agent.tools.shell_syntax import ShellSyntaxError, Word

__all__ = ["BlockedCommandError", "check_command"]

MAX_COMMAND_BYTES = 131_072  # Linux MAX_ARG_STRLEN: `bash -c` cannot take a longer command anyway
MAX_NESTING = 8
MAX_WRAPPED_WORDS = 1_000


@dataclass
class _Candidate:
    """A word that may be run as a program, with the words after it."""

    words: list[Word]
    index: int
    primary: bool  # the command word, or the likely command after a wrapper's options

    @property
    def word(self) -> Word:
        return self.words[self.index]

    @property
    def name(self) -> str:
        return program_name(self.word.value)

    @property
    def args(self) -> list[Word]:
        return self.words[self.index + 1 :]


def check_command(command: str) -> None:
    """Raise ``BlockedCommandError`` when ``command`` must not run; return when it may."""
    if "\x00" in command:
        raise blocked("the command contains a NUL byte")
    try:
        size = len(command.encode("utf-8"))
    except UnicodeEncodeError:
        raise blocked("the command is not valid UTF-8 text") from None
    if size > MAX_COMMAND_BYTES:
        raise blocked(f"the command is {size} bytes long; at most {MAX_COMMAND_BYTES} bytes are accepted")
    _Checker().check(command, 0)


class _Checker:
    def __init__(self) -> None:
        self._seen: dict[str, set[str]] = {}

    def check(self, text: str, depth: int) -> set[str]:
        """Check a command line; return the names of the programs it may run."""
        if text in self._seen:
            return self._seen[text]
        if depth > MAX_NESTING:
            raise blocked(f"commands nested more than {MAX_NESTING} levels deep cannot be checked")
        try:
            script = parse(text)
        except ShellSyntaxError as exc:
            raise blocked(f"the command cannot be parsed ({exc}), so it cannot be checked") from None
        scan_text(text)
        names: set[str] = set()
        opaque_seen = False
        for command in script.commands:
            names |= self._check_command(command, depth)
            if command.piped_in and self._reads_program_from_stdin(command):
                self._check_piped_program(command, opaque_seen, depth)
            opaque_seen = opaque_seen or bool(_command_names(command) & OPAQUE_SOURCES)
        for body in script.substitutions():
            names |= self.check(body, depth + 1)
        self._seen[text] = names
        return names

    def _check_command(self, command: Command, depth: int) -> set[str]:
        for redirect in command.redirects:
            target = redirect.target.value if redirect.target is not None else ""
            if redirect.op in OUTPUT_REDIRECTS and DEVICE.match(target):
                raise blocked(f"writing to the disk device {target} is not allowed")
        candidates = _candidates(command)
        names: set[str] = set()
        for candidate in candidates:
            names.add(candidate.name)
            names |= self._check_candidate(candidate, command, depth)
        return names

    def _check_candidate(self, c: _Candidate, command: Command, depth: int) -> set[str]:
        word, name = c.word, c.name
        if c.primary and (word.dynamic or word.pattern):
            raise blocked(
                f"the program name {word.raw!r} is only known when the command runs "
                "(variable, substitution or pattern), so it cannot be checked; write the program name literally"
            )
        reason = blocked_reason(name)
        if reason is not None:
            raise blocked(f"`{name}` is not allowed ({reason})")
        if name in ARGUMENT_RULES:
            check_arguments(name, c.args)
        nested: set[str] = set()
        for script in self._strings_run_by(c, command):
            nested |= self.check(script, depth + 1)
        if name in SHELLS or name in {"source", ".", "eval", "exec"} or INTERPRETER.fullmatch(name):
            self._check_consumer(name, c.args, command, depth)
        if INTERPRETER.fullmatch(name):
            for text in [a.value for a in c.args] + _stdin_texts(command):
                if CODE_CALL.search(text):
                    raise blocked(f"the `{name}` code runs a blocked program")
        return nested

    def _strings_run_by(self, c: _Candidate, command: Command) -> list[str]:
        """Text that this command hands to a shell to run."""
        name = c.name
        if name not in RUNS_STRINGS:
            return []
        args = c.args
        values = [a.value for a in args]
        if name in SHELLS:
            script, reads_stdin = _shell_invocation(args)
            if script is not None:
                return [script]
            return _stdin_texts(command) if reads_stdin else []
        if name == "eval":
            return [" ".join(values)]
        if name == "trap":
            options = [v for v in values if v.startswith("-")]
            rest = [v for v in values if not v.startswith("-")]
            return rest[:1] if "-p" not in options and "-l" not in options else []
        if name == "alias":
            return [v.split("=", 1)[1] for v in values if "=" in v]
        if name in STRING_RUNNERS:
            return [v for v in values if not v.startswith("-")]
        if name == "env" and any(v.startswith(("-S", "--split-string")) for v in values):
            return [v.removeprefix("--split-string=").removeprefix("-S") for v in values]
        if name in {"at", "batch"}:
            return _stdin_texts(command)
        return []

    def _check_consumer(self, name: str, args: list[Word], command: Command, depth: int) -> None:
        """A shell, interpreter, ``source`` or ``eval`` must not run downloaded or decoded content."""
        words = list(args) + [r.target for r in command.redirects if r.target is not None]
        for word in words:
            if "<(" in word.raw and word.substitutions:
                # `source <(…)`, `bash <(…)`, `sh < <(…)`: the program is the output of a command.
                raise blocked(f"`{name}` would run the output of a process substitution, which cannot be checked")
            for body in word.substitutions:
                if self.check(body, depth + 1) & OPAQUE_SOURCES:
                    raise blocked(f"`{name}` would run downloaded or decoded content")

    def _reads_program_from_stdin(self, command: Command) -> bool:
        candidates = _candidates(command)
        led_by = candidates[0].name if candidates else ""
        for c in candidates:
            name, values = c.name, [a.value for a in c.args]
            if name in SHELLS:
                if led_by in {"xargs", "parallel"} or _shell_invocation(c.args)[1]:
                    return True
            elif INTERPRETER.fullmatch(name) and not name.endswith("awk"):
                if not any(v in CODE_OPTIONS for v in values):
                    positional = [v for v in values if not v.startswith("-") or v == "-"]
                    if not positional or positional[0] in STDIN_PATHS:
                        return True
            elif (name in {"source", "."} and values[:1] and values[0] in STDIN_PATHS) or name in {
                "at",
                "batch",
            }:
                return True
        return False

    def _check_piped_program(self, command: Command, opaque_seen: bool, depth: int) -> None:
        """Text piped into a shell is run: allow only a literal ``echo`` whose text passes the check."""
        source = command.pipe_from
        if source is not None and source.words and not opaque_seen:
            head, args = program_name(source.words[0].value), source.words[1:]
            literal = all(not (a.dynamic or a.pattern or "\\" in a.value or "%" in a.value) for a in args)
            if head == "echo" and literal and not any(a.value.startswith("-") for a in args):
                self.check(" ".join(a.value for a in args), depth + 1)
                return
        if opaque_seen:
            raise blocked(
                "downloaded or decoded content piped into a shell or interpreter (like `curl … | sh`)"
            )
        raise blocked(
            "text piped into a shell or interpreter cannot be checked; save it to a file and run the file, "
            "or run the commands directly"
        )


def _candidates(command: Command) -> list[_Candidate]:
    words = command.words
    if not words:
        return []
    head = program_name(words[0].value)
    if head not in WRAPPERS or (head == "command" and words[1:2] and words[1].value in ("-v", "-V")):
        return [_Candidate(words, 0, primary=True)]
    if len(words) > MAX_WRAPPED_WORDS:
        raise blocked(f"a `{head}` command with more than {MAX_WRAPPED_WORDS} words cannot be checked")
    likely = _likely_command_index(head, words)
    return [_Candidate(words, i, primary=i in (0, likely)) for i in range(len(words))]


_WRAPPER_VALUE_OPTIONS = {
    "nice": {"-n", "--adjustment"}, "timeout": {"-s", "--signal", "-k", "--kill-after"},
    "env": {"-u", "--unset", "-C", "--chdir"}, "exec": {"-a"}, "ionice": {"-c", "-n", "-p", "-t"},
    "xargs": {"-I", "-d", "-E", "-L", "-n", "-P", "-s", "-a", "--arg-file", "--delimiter",
              "--max-args", "--max-procs", "--max-lines", "--max-chars", "--eof", "--replace"},
    "watch": {"-n", "--interval", "-d"}, "stdbuf": {"-i", "-o", "-e"}, "strace": {"-o", "-e", "-p", "-s"},
    "flock": {"-w", "--timeout", "-E", "--conflict-exit-code"},
}  # fmt: skip
_WRAPPER_POSITIONALS = {"timeout": 1, "chroot": 1, "taskset": 1, "flock": 1, "sg": 1, "chrt": 1}


def _likely_command_index(head: str, words: list[Word]) -> int:
    """Where the wrapped command most likely starts (only used to refuse a dynamic name there)."""
    value_options = _WRAPPER_VALUE_OPTIONS.get(head, set())
    positionals = _WRAPPER_POSITIONALS.get(head, 0)
    i = 1
    while i < len(words):
        value = words[i].value
        if value == "--":
            return i + 1
        if value in value_options:
            i += 2
        elif value.startswith("-") or (head == "env" and "=" in value):
            i += 1
        elif positionals:
            positionals -= 1
            i += 1
        else:
            return i
    return i


def _shell_invocation(args: list[Word]) -> tuple[str | None, bool]:
    """(the ``-c`` script or None, whether the shell reads its script from stdin)."""
    flags: set[str] = set()
    positional: list[str] = []
    i = 0
    while i < len(args):
        value = args[i].value
        if value == "--":
            positional.extend(a.value for a in args[i + 1 :])
            break
        if value in SHELL_VALUE_OPTIONS:
            i += 2
            continue
        if len(value) > 1 and value[0] in "-+" and not value.startswith("--"):
            if value[0] == "-":
                flags.update(value[1:])
        elif not value.startswith("--"):
            positional.extend(a.value for a in args[i:])
            break
        i += 1
    if "c" in flags:
        return (positional[0] if positional else ""), False
    return None, "s" in flags or not positional or positional[0] in STDIN_PATHS


def _stdin_texts(command: Command) -> list[str]:
    """Here-documents and here-strings given to this command."""
    texts = []
    for redirect in command.redirects:
        if redirect.heredoc is not None:
            texts.append(redirect.heredoc)
        elif redirect.op == "<<<" and redirect.target is not None:
            texts.append(redirect.target.value)
    return texts


def _command_names(command: Command) -> set[str]:
    return {c.name for c in _candidates(command)}
