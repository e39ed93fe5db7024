"""Helpers shared by the benchmark scripts: percentiles, tables, JSON reports, process
memory and CPU, the fake OpenAI server in a subprocess, and a Redis to measure against.

Scripts import it as ``bench.common`` (run them from the repository root, or let them
put the root on ``sys.path`` as ``bench/gateway.py`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]


# ---- statistics ---------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in 0..100; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = min(len(ordered), max(1, math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max in milliseconds (rounded to µs) of samples given in seconds."""
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 3),
        "p90_ms": round(percentile(ms, 90), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "max_ms": round(max(ms), 3) if ms else float("nan"),
    }


def seconds_summary(values: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max in seconds (rounded to ms) of samples given in seconds."""
    return {
        "n": len(values),
        "p50_s": round(percentile(values, 50), 3),
        "p90_s": round(percentile(values, 90), 3),
        "p99_s": round(percentile(values, 99), 3),
        "max_s": round(max(values), 3) if values else float("nan"),
    }


# ---- output -------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, markdown: bool = False) -> str:
    """A plain-text (or Markdown) table; numbers right-aligned, the first column left."""
    cells = [[_cell(v) for v in row] for row in rows]
    if markdown:
        align = ["---"] + ["---:"] * (len(headers) - 1)
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True))
        )

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "–"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    return str(value)


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
    }


def report_header(name: str, script: str) -> dict[str, Any]:
    """The fields every report starts with: name, exact command, machine, time."""
    return {
        "benchmark": name,
        "command": " ".join([".venv/bin/python", script, *sys.argv[1:]]),
        **machine(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    print(f"wrote {shown}", flush=True)


# ---- processes ----------------------------------------------------------------------


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of a process (this one by default)."""
    return int(psutil.Process(pid or os.getpid()).memory_info().rss)


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU time of a process (this one by default)."""
    times = psutil.Process(pid or os.getpid()).cpu_times()
    return float(times.user + times.system)


def proc_cpu(pid: int | None) -> float:
    """``cpu_seconds`` of another process; NaN when there is none (or it is gone)."""
    if pid is None:
        return float("nan")
    try:
        return cpu_seconds(pid)
    except psutil.Error:
        return float("nan")


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent not idle (all cores)."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def mib(n: float) -> float:
    return round(n / 2**20, 1)


class RssSampler:
    """Samples this process' RSS in the background; ``peak`` is the highest seen."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.peak = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RssSampler:
        self.peak = rss_bytes()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.peak = max(self.peak, rss_bytes())

    async def _run(self) -> None:
        process = psutil.Process()
        while True:
            self.peak = max(self.peak, int(process.memory_info().rss))
            await asyncio.sleep(self.interval_s)


@dataclass
class FakeLLM:
    """The fake OpenAI server running in a subprocess."""

    process: asyncio.subprocess.Process
    base_url: str  # http://127.0.0.1:PORT/v1

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    @property
    def pid(self) -> int:
        return self.process.pid


@contextlib.asynccontextmanager
async def fake_llm_subprocess(latency_ms: float = 0.0, chunk_delay_ms: float = 0.0) -> AsyncIterator[FakeLLM]:
    """``python -m tests.fakes.openai_server`` in a subprocess, so its CPU time is not
    charged to the measured process; yields once it printed its address."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.fakes.openai_server", "--port", "0",
        "--latency-ms", str(latency_ms), "--chunk-delay-ms", str(chunk_delay_ms),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the fake OpenAI server did not start: {line!r}")
        yield FakeLLM(proc, line.removeprefix("listening on "))
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


# A fake Bot API in its own process, ``argv[1]`` private messages waiting in it.
_FAKE_TELEGRAM = """
import asyncio, sys
from tests.fakes.telegram_server import FakeTelegram

async def main() -> None:
    fake = FakeTelegram()
    await fake.start()
    for i in range(int(sys.argv[1])):
        fake.push_message(fake.private_message(42, f"message {i}"))
    print(fake.base_url, fake.token, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the bench closes stdin
    await fake.stop()

asyncio.run(main())
"""


@contextlib.asynccontextmanager
async def fake_telegram_subprocess(messages: int = 0) -> AsyncIterator[tuple[str, str, int]]:
    """(base URL, token, pid) of ``tests.fakes.telegram_server`` in a subprocess, so its
    CPU is not charged to the measured process, with ``messages`` updates from chat 42
    waiting in it."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _FAKE_TELEGRAM, str(messages), cwd=ROOT,
                                                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        base_url, token = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()
        yield base_url, token, proc.pid
    finally:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def sdk_post_unread(client: Any, body: bytes) -> None:
    """One streamed ``/chat/completions`` through ``LLMClient``'s SDK client as botd
    sends it, the body read raw and not decoded: the SDK's request layer alone."""
    import httpx2

    response = await client._client.post(
        "/chat/completions", cast_to=httpx2.Response, content=body, stream=True, stream_cls=None
    )
    async for _ in response.aiter_bytes():
        pass
    await response.aclose()


async def cpu_per_call(
    rows: Mapping[str, Callable[[], Awaitable[Any]]], *, calls: int, rounds: int, warmup: int, key: str
) -> dict[str, dict[str, Any]]:
    """CPU µs of this process per call of each row (``key``: the median of the rounds, and
    ``rounds``). Rows alternate within every round, so the machine's drift falls on all of
    them alike; each is warmed up with ``warmup`` calls before it is timed."""
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(rounds):
        for name, call in rows.items():
            for _ in range(warmup):
                await call()
            start = time.process_time()
            for _ in range(calls):
                await call()
            samples[name].append((time.process_time() - start) / calls * 1e6)
    return {name: {key: round(statistics.median(v), 1), "rounds": [round(x, 1) for x in v]}
            for name, v in samples.items()}


# What a workspace in use holds for the system prompt (``--lived-in``): its persona, its
# memory and notes about the user, of these sizes in bytes.
LIVED_IN_FILES = {"IDENTITY.md": 1_000, "SOUL.md": 2_000, "MEMORY.md": 8_000, "USER.md": 1_000}


def lived_in(workspace: Path) -> None:
    """Write :data:`LIVED_IN_FILES` into ``workspace`` (made if missing)."""
    workspace.mkdir(parents=True, exist_ok=True)
    line = "- a note the assistant keeps, one line of several in this file\n"
    for name, size in LIVED_IN_FILES.items():
        (workspace / name).write_text((line * (size // len(line) + 1))[:size], encoding="utf-8")


@contextlib.contextmanager
def temp_workspace(prefix: str = "botd-bench-") -> Any:
    """A temporary directory for a workspace (and the embedded Valkey it starts).

    Under /tmp rather than a deep path: the Valkey unix socket path must stay short.
    """
    with tempfile.TemporaryDirectory(prefix=prefix, dir="/tmp") as tmp:
        yield Path(tmp)


def redis_url_from_env(explicit: str | None) -> str | None:
    """``--redis-url``, else ``REDIS_URL``, else None (the embedded Valkey)."""
    return explicit or os.environ.get("REDIS_URL") or None


async def command_calls(client: Any) -> dict[str, int]:
    """Calls per command name a Redis server has processed so far (INFO commandstats;
    the INFO calls themselves included)."""
    stats = await client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if isinstance(v, dict)}


def child_pid(match: str) -> int | None:
    """The first child process whose command line contains ``match`` (e.g. the
    embedded valkey-server), to read its CPU time and memory."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if match in " ".join(child.cmdline()):
                return child.pid
    return None


class RoundTrips:
    """Requests this process sends to Redis (a pipeline or a script call is one), counted
    at redis-py's connection; ``count`` so far. Valkey's own counters include every
    command a script runs, which says little about round trips."""

    count = 0
    _installed = False

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        from redis.asyncio.connection import AbstractConnection

        from bot.store.pool import PromptWrite

        # botd's store connection writes by itself (it falls back to redis-py's method only
        # to connect): each request is counted once, at the class that sends it.
        for klass in (AbstractConnection, PromptWrite):
            original = klass.__dict__["send_packed_command"]

            async def counted(self: Any, command: Any, check_health: bool = True, *,
                              _original: Any = original, _klass: type = klass) -> None:
                if _klass is PromptWrite or not isinstance(self, PromptWrite):
                    cls.count += 1
                await _original(self, command, check_health)

            klass.send_packed_command = counted  # type: ignore[method-assign]
        cls._installed = True
