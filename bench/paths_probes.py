"""What ``bench/paths.py`` reads from outside a running botd: the CPU and memory of its
process tree from /proc, its embedded Valkey's counters, and its JSON log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil
import redis.asyncio as aioredis

from bot.store.embedded import EmbeddedPaths

RUN_FINISHED = b'"run.finished"'
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class TreeCPU:
    """CPU of a process tree at one moment. ``ticks_s``: utime+stime (+cutime+cstime, the
    reaped children) of every process from /proc/<pid>/stat, in 1/CLK_TCK steps (10 ms),
    good for totals; ``exact_s``: the scheduler's nanosecond run time of every live
    thread (/proc/<pid>/task/*/schedstat), fine enough for one message."""

    ticks_s: float
    exact_s: float
    rss: int
    store_exact_s: float = 0.0  # the embedded Valkey's share of exact_s
    store_rss: int = 0  # the embedded Valkey's share of rss


def tree_pids(root: int) -> list[int]:
    try:
        return [root, *(c.pid for c in psutil.Process(root).children(recursive=True))]
    except psutil.Error:
        return []


def tree_cpu(root: int) -> TreeCPU:
    ticks = exact = store = 0.0
    rss = store_rss = 0
    for pid in tree_pids(root):
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            is_store = "valkey" in stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            ticks += sum(int(v) for v in fields[11:15]) / CLOCK_TICKS  # utime stime cutime cstime
            resident = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
            rss += resident
            store_rss += resident if is_store else 0
            for task in os.scandir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError):
                    ran = int(Path(task.path, "schedstat").read_text().split()[0]) / 1e9
                    exact += ran
                    store += ran if is_store else 0.0
    return TreeCPU(ticks, exact, rss, store, store_rss)


@dataclass(frozen=True)
class StoreCounters:
    commands: Counter[str]  # calls per command (INFO commandstats), INFO itself left out
    reads: int  # read events Valkey processed (total_reads_processed): one per request batch


class StoreProbe:
    """A client of the workspace's embedded Valkey (socket and password under
    ``<workspace>/.botd``), reading its counters. Each ``counters()`` is one INFO, whose
    own read is taken out of the deltas."""

    def __init__(self, workspace: Path) -> None:
        paths = EmbeddedPaths.for_workspace(workspace)
        self.client = aioredis.Redis(unix_socket_path=str(paths.socket),
                                     password=paths.password.read_text().strip())

    async def counters(self) -> StoreCounters:
        info = await self.client.info("all")
        commands = Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()
                            if k.startswith("cmdstat_") and k != "cmdstat_info"})
        return StoreCounters(commands, int(info["total_reads_processed"]))

    async def used_memory(self) -> int:
        """Bytes the store holds (INFO used_memory): the sessions' data, not the process."""
        return int((await self.client.info("memory"))["used_memory"])

    @staticmethod
    def delta(before: StoreCounters, after: StoreCounters) -> tuple[int, int, Counter[str]]:
        """(commands, round trips, commands by name) between two readings."""
        by_name = after.commands - before.commands
        return sum(by_name.values()), after.reads - before.reads - 1, by_name

    async def close(self) -> None:
        await self.client.aclose()


def log_events(path: Path, top: int = 20) -> dict[str, int]:
    """The events of a botd JSON log other than ``run.finished``, by name (with the
    level when it is a warning or worse), most frequent first."""
    counts: Counter[str] = Counter()
    with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
        for line in f:
            if RUN_FINISHED in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                counts["(not JSON)"] += 1
                continue
            level = record.get("level", "")
            counts[f"{record.get('event')}" + (f" ({level})" if level not in ("info", "debug") else "")] += 1
    return dict(counts.most_common(top))


class LogTail:
    """Counts ``run.finished`` events in a botd JSON log as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._tail = b""
        self.runs = 0

    def poll(self) -> int:
        with contextlib.suppress(FileNotFoundError), self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
            self._offset += len(data)
            lines = (self._tail + data).split(b"\n")
            self._tail = lines.pop()
            self.runs += sum(1 for line in lines if RUN_FINISHED in line)
        return self.runs

    async def wait_runs(self, count: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.poll() < count:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.005)
        return True
