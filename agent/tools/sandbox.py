"""The OS sandbox every tool subprocess runs in (bubblewrap), and the limits it runs under.

A tool's process is steered by whoever can put text in front of the model, so it
must not reach what the daemon holds. Under bubblewrap (``bwrap``) it gets new PID,
IPC, UTS, user and (unless network is allowed) network namespaces; a mount
namespace where the whole system is read-only, the given writable directories are
the only writable places, ``/tmp``, ``/dev`` and ``/proc`` are private (the tool
sees only its own processes, never the daemon's ``environ`` or ``cmdline``), and
botd's own files (config file, ``<workspace>/.botd``, store socket and data,
secrets) are masked. ``--die-with-parent`` plus the PID namespace mean that killing
the ``bwrap`` process ends every process inside: no ``setsid``, ``nohup`` or double
fork survives it.

Limits (``ToolLimits``) are applied to the process tree with ``prlimit`` (file size,
address space, open files, processes). The kernel does not count processes for
root, so when the daemon runs as root and a pids cgroup is writable, each call also
gets its own cgroup with ``pids.max``.

Use (``bash``, CLI tools, and long-lived stdio servers alike)::

    cmd = ctx.settings.sandbox_command(argv, env)      # a session's paths and limits, or
    cmd = sandbox.wrap(argv, cwd=workdir, env=env, writable=[workdir], readonly=[...], hidden=[...])
    proc = await asyncio.create_subprocess_exec(*cmd.argv, env=cmd.env, cwd=cmd.cwd,
                                                start_new_session=True, stdin=PIPE, stdout=PIPE)
    # to end it: os.killpg(proc.pid, SIGKILL) (the whole sandbox goes), await proc.wait(),
    # then cmd.release()

The daemon builds one ``Sandbox`` at start (``Sandbox.from_mode``: probes bubblewrap
once) and hands it to the tools in ``ToolSettings.sandbox``.

``wrap`` is a plain function of its inputs: it starts nothing and can be called
from any thread. ``release`` removes the per-call cgroup (a no-op without one); call
it once the process has exited.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

SandboxMode = Literal["auto", "bwrap", "off"]
_MIB = 1024 * 1024
_PROBE_TIMEOUT_S = 10.0
# Joins the per-call pids cgroup before exec, so every descendant is counted.
_JOIN_CGROUP = 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"'


class SandboxUnavailable(RuntimeError):
    """``security.sandbox: bwrap`` was asked for but bubblewrap cannot run here."""


@dataclass(frozen=True)
class ToolLimits:
    """Per tool call, for its whole process tree (DESIGN §7.1 defaults)."""

    processes: int = 256
    file_size_mb: int = 256
    memory_mb: int = 2048
    open_files: int = 1024

    def prlimit_args(self) -> list[str]:
        return [
            f"--nproc={self.processes}",
            f"--fsize={self.file_size_mb * _MIB}",
            f"--as={self.memory_mb * _MIB}",
            f"--nofile={self.open_files}",
        ]


@dataclass
class SandboxCommand:
    """What to exec: ``argv`` with exactly ``env``, started in ``cwd``."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    cgroup: Path | None = None

    def release(self) -> None:
        """Kill whatever is left in the per-call cgroup and remove it (idempotent; call after exit)."""
        if self.cgroup is None:
            return
        for _ in range(500):  # at most about a second: exiting processes leave the list quickly
            try:
                pids = [int(p) for p in (self.cgroup / "cgroup.procs").read_text(encoding="ascii").split()]
            except (OSError, ValueError):
                break
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)
        with contextlib.suppress(OSError):
            self.cgroup.rmdir()
        self.cgroup = None


@dataclass
class Sandbox:
    """How tool processes are confined on this host; build with ``from_mode`` (probes once)."""

    bwrap: str | None
    network: bool = False
    limits: ToolLimits = field(default_factory=ToolLimits)
    hidden: tuple[Path, ...] = ()
    prlimit: str | None = None
    pids_cgroup: Path | None = None
    reason: str = ""  # why it is off, when it is

    @property
    def active(self) -> bool:
        return self.bwrap is not None

    @classmethod
    def from_mode(
        cls,
        mode: SandboxMode,
        *,
        network: bool = False,
        limits: ToolLimits | None = None,
        hidden: Iterable[Path] = (),
    ) -> Sandbox:
        """Probe bubblewrap for ``auto``/``bwrap``; raises ``SandboxUnavailable`` for ``bwrap`` when it fails."""
        limits = limits or ToolLimits()
        prlimit = shutil.which("prlimit")
        common = {
            "network": network, "limits": limits, "hidden": tuple(Path(p) for p in hidden),
            "prlimit": prlimit, "pids_cgroup": _pids_cgroup() if os.geteuid() == 0 else None,
        }
        if mode == "off":
            return cls(bwrap=None, reason="security.sandbox is off", **common)  # type: ignore[arg-type]
        problem = probe_bwrap()
        if problem is None and prlimit is None:
            problem = "prlimit (util-linux) is not installed"
        if problem is not None:
            if mode == "bwrap":
                raise SandboxUnavailable(problem)
            return cls(bwrap=None, reason=problem, **common)  # type: ignore[arg-type]
        return cls(bwrap=shutil.which("bwrap"), **common)  # type: ignore[arg-type]

    def wrap(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        writable: Iterable[Path] = (),
        readonly: Iterable[Path] = (),
        hidden: Iterable[Path] = (),
    ) -> SandboxCommand:
        """The command that runs ``argv`` in ``cwd`` confined: only ``writable`` (and a private
        ``/tmp``) can be written, ``readonly`` paths are bound read-only, the sandbox's own
        ``hidden`` paths plus these ``hidden`` are masked; for nested paths the deepest rule
        wins. Missing paths are skipped. Off: the limits still apply, nothing else changes."""
        if not argv:
            raise ValueError("empty command")
        inner = [*self._limit_prefix(), *argv]
        cgroup = self._new_cgroup()
        if self.bwrap is None:
            outer = inner
        else:
            outer = [self.bwrap, *self._bwrap_args(cwd, writable, readonly, hidden), "--", *inner]
        if cgroup is not None:
            outer = ["/bin/sh", "-c", _JOIN_CGROUP, "sh", str(cgroup), *outer]
        sandbox_env = dict(env)
        if self.bwrap is not None:
            sandbox_env["TMPDIR"] = "/tmp"
        return SandboxCommand(argv=outer, env=sandbox_env, cwd=cwd, cgroup=cgroup)

    def describe(self) -> str:
        """One line for start-up logs, /readyz and ``botd doctor``."""
        if self.active:
            net = "network allowed" if self.network else "no network"
            return f"bubblewrap ({net})"
        return f"OFF: tools run with the daemon's user rights ({self.reason})"

    def _limit_prefix(self) -> list[str]:
        if self.prlimit is None:
            return []
        return [self.prlimit, *self.limits.prlimit_args(), "--"]

    def _bwrap_args(
        self, cwd: Path, writable: Iterable[Path], readonly: Iterable[Path], hidden: Iterable[Path]
    ) -> list[str]:
        args = ["--die-with-parent", "--new-session", "--unshare-all"]
        if self.network:
            args.append("--share-net")
        args += ["--cap-drop", "ALL", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        # The most specific path wins: mounts go shallow to deep (a mask beats a bind of the same path),
        # so a writable session directory can sit inside a masked one and a masked .botd inside a bound root.
        mounts = [(p, 0) for p in _existing(writable)] + [(p, 1) for p in _existing(readonly)]
        mounts += [(p, 2) for p in _existing([*self.hidden, *hidden])]
        sealed: list[str] = []  # masks are made read-only last: deeper binds need mount points in them
        for path, kind in sorted(mounts, key=lambda m: (len(m[0].parts), m[1])):
            if kind == 0:
                args += ["--bind", str(path), str(path)]
            elif kind == 1:
                args += ["--ro-bind", str(path), str(path)]
            elif path.is_dir():
                args += ["--tmpfs", str(path)]
                sealed += ["--remount-ro", str(path)]
            else:
                args += ["--ro-bind", "/dev/null", str(path)]
        args += [*sealed, "--chdir", str(cwd)]
        return args

    def _new_cgroup(self) -> Path | None:
        if self.pids_cgroup is None:
            return None
        path = self.pids_cgroup / f"botd-tool-{uuid.uuid4().hex[:12]}"
        try:
            path.mkdir()
            (path / "pids.max").write_text(str(self.limits.processes), encoding="ascii")
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return path


def probe_bwrap() -> str | None:
    """None when bubblewrap can build a sandbox here, else the reason it cannot."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    argv = [bwrap, "--die-with-parent", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev",
            "--proc", "/proc", "--tmpfs", "/tmp", "--", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=_PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap did not run: {exc}"
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()
        return f"bubblewrap cannot create namespaces here: {detail[-1] if detail else done.returncode}"
    return None


def _existing(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        real = Path(os.path.realpath(os.path.expanduser(str(path))))
        if real.exists() and real not in out:
            out.append(real)
    return out


def _pids_cgroup() -> Path | None:
    """The writable pids-controller directory of this process's cgroup, if there is one."""
    try:
        lines = Path("/proc/self/cgroup").read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if "pids" in controllers.split(","):
            base = Path("/sys/fs/cgroup/pids") / rel.lstrip("/")
        elif controllers == "":
            base = Path("/sys/fs/cgroup") / rel.lstrip("/")
            try:
                if "pids" not in (base / "cgroup.subtree_control").read_text(encoding="ascii").split():
                    continue
            except OSError:
                continue
        else:
            continue
        if (base / "cgroup.procs").exists() and os.access(base, os.W_OK):
            return base
    return None
