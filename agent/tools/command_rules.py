"""What the bash blocklist refuses: programs, dangerous arguments, and raw-text patterns.

The tables and per-program rules of the blocklist; ``command_guard`` finds the
commands of a line and applies these to each. Defence in depth, not a sandbox.
"""

from __future__ import annotations

import functools
import posixpath
import re

from agent.tools.registry import ToolError
from agent.tools.shell_syntax import Word

_DELETES, _AS_OTHER_USER, _POWER, _DISKS = (
    "deletes files",
    "runs commands as another user",
    "stops or restarts the machine",
    "writes to or formats disks",
)
_BLOCKED = {
    "rm": _DELETES, "unlink": _DELETES, "shred": "destroys file contents",
    "sudo": _AS_OTHER_USER, "su": _AS_OTHER_USER, "doas": _AS_OTHER_USER, "pkexec": _AS_OTHER_USER,
    "runuser": _AS_OTHER_USER, "shutdown": _POWER, "reboot": _POWER, "halt": _POWER,
    "poweroff": _POWER, "telinit": _POWER, "dd": _DISKS, "mke2fs": _DISKS, "mkswap": _DISKS,
    "wipefs": _DISKS, "fdisk": _DISKS, "sfdisk": _DISKS, "cfdisk": _DISKS, "parted": _DISKS,
    "sgdisk": _DISKS, "blkdiscard": _DISKS,
}  # fmt: skip
WRAPPERS = {
    "command", "builtin", "exec", "env", "nice", "nohup", "time", "timeout", "xargs", "setsid",
    "stdbuf", "ionice", "chrt", "taskset", "flock", "watch", "chroot", "strace", "ltrace",
    "unbuffer", "busybox", "toybox", "find", "parallel", "coproc", "caffeinate", "systemd-run",
    "nsenter", "unshare", "firejail", "proxychains", "proxychains4", "torsocks", "valgrind",
    "catchsegv", "script", "sg", "tmux", "screen", "ssh-agent", "dbus-launch", "fakeroot",
}  # fmt: skip
STRING_RUNNERS = {"watch", "parallel", "script", "flock", "sg", "tmux", "screen"}  # run a string via a shell
SHELLS = {"sh", "bash", "rbash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "fish", "csh", "tcsh"}
INTERPRETER = re.compile(
    r"(python|pypy|perl|ruby|php|lua|luajit|tclsh|node|nodejs|deno|bun|Rscript|osascript)[\d.]*"
    r"|[gmn]?awk"
)
DOWNLOADERS = {
    "curl", "wget", "fetch", "aria2c", "lwp-request", "lwp-download", "GET", "http", "https",
    "xh", "nc", "ncat", "netcat", "socat", "ftp", "tftp", "scp", "sftp", "rsync",
}  # fmt: skip
OPAQUE_SOURCES = DOWNLOADERS | {"base64", "xxd", "uudecode", "openssl", "gpg", "rev"}
STDIN_PATHS = {"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"}
CODE_OPTIONS = {"-c", "-e", "-E", "-m", "-r", "-p", "--eval", "--print", "-x"}
SHELL_VALUE_OPTIONS = {"-o", "+o", "-O", "+O", "--rcfile", "--init-file"}
_WRITERS = {"tee", "cp", "mv", "install", "ln", "truncate", "pv", "sponge", "rsync"}
OUTPUT_REDIRECTS = {">", ">>", ">|", "&>", "&>>", "<>", ">&"}
_SYSTEM_DIRS = {"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/opt", "/proc",
                "/root", "/sbin", "/srv", "/sys", "/usr", "/var"}  # fmt: skip
_POWER_VERBS = {"poweroff", "reboot", "halt", "kexec"}
ARGUMENT_RULES = {"chmod", "chown", "chgrp", "find", "kill", "init", "telinit", "systemctl"} | _WRITERS
RUNS_STRINGS = SHELLS | STRING_RUNNERS | {"eval", "trap", "alias", "env", "at", "batch"}

_NAMES = (
    r"rm|unlink|shred|sudo|su|doas|pkexec|runuser|shutdown|reboot|halt|poweroff|telinit|dd"
    r"|mkfs(?:\.\w+)?|mke2fs|mkswap|wipefs|fdisk|sfdisk|cfdisk|parted|sgdisk|blkdiscard"
)
_ABSOLUTE_PROGRAM = re.compile(rf"(?<![\w.\-])/(?:usr/)?(?:local/)?s?bin/(?:{_NAMES})(?![\w.\-])")
CODE_CALL = re.compile(
    rf"(?:^|(?<=[\s\"'`(\[;|&,]))(?:/(?:usr/)?(?:local/)?s?bin/)?(?:{_NAMES})(?=\s+[-/~.\w\"'$*]|[\"'`])"
)
DEVICE = re.compile(
    r"/dev/(?:[hsv]d[a-z]|xvd[a-z]|nvme\d|mmcblk\d|md\d|dm-\d|loop\d|sr\d|disk/|mapper/|mem$|kmem$|port$)"
)
_FUNCTION_DEF = re.compile(r"(?<![\w:.\-])(?:function)?([\w:.\-]+)\(\)\{")
_PERL_FORK = re.compile(
    r"fork\s*(?:while|until|\|\||&&)\s*fork"
    r"|while\s*(?:\(\s*)?(?:1|true|True)\s*(?:\)\s*)?(?:[:{;]\s*)?(?:os\.)?fork"
)
_WHITESPACE = re.compile(r"\s+")


class BlockedCommandError(ToolError):
    """A command line the bash tool refuses to run; the message says why (for the model)."""


def program_name(value: str) -> str:
    """``/usr/bin/rm`` → ``rm``: the name the program is known by."""
    return value.rsplit("/", 1)[-1]


def blocked(reason: str) -> BlockedCommandError:
    return BlockedCommandError(f"Error: command blocked by the bash safety rules: {reason}. Nothing was run.")


def blocked_reason(name: str) -> str | None:
    """Why the program ``name`` is never allowed, or None when it may run."""
    if name in _BLOCKED:
        return _BLOCKED[name]
    if name.startswith("mkfs"):
        return _DISKS
    return None


def check_arguments(name: str, args: list[Word]) -> None:
    """Rules for programs that are fine in general but not with some arguments."""
    if name not in ARGUMENT_RULES:
        return
    values = [a.value for a in args]
    if name == "chmod" and any(_world_writable(v) for v in values):
        raise blocked("making files world-writable with chmod (777, o+w, a+rwx …) is not allowed")
    if name in {"chown", "chgrp"}:
        for arg in args:
            if not arg.value.startswith("-") and _system_path(arg):
                raise blocked(f"`{name}` on {arg.value} is not allowed")
    if name == "find" and "-delete" in values:
        raise blocked("`find -delete` is not allowed (deletes files)")
    if name == "kill" and "-1" in _kill_targets(values):
        raise blocked("`kill -1` would signal every process of the user, botd included")
    if name in {"init", "telinit"} and any(v in {"0", "6"} for v in values):
        raise blocked(f"`{name}` {_POWER}")
    if name == "systemctl" and _POWER_VERBS & set(values):
        raise blocked(f"`systemctl` {_POWER}")
    if name in _WRITERS:
        for value in values:
            if DEVICE.match(value):
                raise blocked(f"writing to the disk device {value} is not allowed")


def _kill_targets(values: list[str]) -> list[str]:
    if not values:
        return []
    if values[0] in ("-s", "-n"):
        return values[2:]
    if values[0] == "--" or values[0].startswith("-"):
        return [v for v in values[1:] if v != "--"]
    return values


@functools.lru_cache(maxsize=4096)
def _world_writable(mode: str) -> bool:
    if re.fullmatch(r"[0-7]+", mode):
        return bool(int(mode[-1]) & 2)
    for clause in mode.split(","):
        m = re.fullmatch(r"([ugoa]*)((?:[-+=][rwxXstugo]*)+)", clause)
        if not m or not (set(m.group(1)) & {"o", "a"}):
            continue
        for op, perms in re.findall(r"([-+=])([rwxXstugo]*)", m.group(2)):
            if op in "+=" and ("w" in perms or set(perms) & {"u", "g"}):
                return True
    return False


def _system_path(word: Word) -> bool:
    return _is_system_path(word.value, word.pattern)


@functools.lru_cache(maxsize=4096)
def _is_system_path(value: str, pattern: bool) -> bool:
    path = re.sub(r"/+", "/", value)
    if not path.startswith("/"):
        return False
    normal = posixpath.normpath(path)
    return normal in _SYSTEM_DIRS or (pattern and posixpath.dirname(normal) == "/")


def scan_text(text: str) -> None:
    """Checks on the raw text that no parse can hide: fork bombs, blocked programs by path."""
    match = _ABSOLUTE_PROGRAM.search(text)
    if match:
        raise blocked(f"the command refers to the blocked program {match.group(0)}")
    compact = _WHITESPACE.sub("", text)
    for count, definition in enumerate(_FUNCTION_DEF.finditer(compact)):
        if count >= 100:
            break
        name = re.escape(definition.group(1))
        body = compact[definition.end() : definition.end() + 4096]
        if re.search(rf"(?<![\w:.\-]){name}[|&]", body):
            raise blocked("the command looks like a fork bomb")
    if _PERL_FORK.search(text):
        raise blocked("the command looks like a fork bomb")
