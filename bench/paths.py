"""The whole daemon, per path: ``botd run`` (or ``botd chat``) as a user runs it, measured
from the outside.

For each path — Telegram polling, Telegram webhook, Slack Socket Mode, Slack HTTP
(Events API), console — one botd process starts with its embedded Valkey (its own
child, in a temporary workspace) and botd's defaults, except ``gateway.
max_concurrent_runs`` (``--max-concurrent-runs``, 2000: the load part has 1,000 chats
at once) and, when given, ``queue.debounce_ms``. The fake Telegram or Slack runs in
this process, the fake OpenAI server in a subprocess of its own, echoing the user's
message (whose last word is a marker, so the answer is complete once the marker is
shown). The console path is ``botd chat`` with stdin and stdout on pipes (it reads any
descriptor without blocking; no pseudo-terminal needed); it has one chat, so no burst
and no load.

Parts (``--parts``, in this order):

* cpu, lone — ``--messages`` messages one at a time over 10 chats (after ``--warmup``),
  LLM latency 0; each waits until its run has finished (``run.finished`` in the log).
  *cpu*: CPU of the process tree (botd + Valkey + any children) per message, p50 from
  the scheduler's per-thread nanosecond counters (/proc/<pid>/task/*/schedstat), and the
  total over all messages from /proc/<pid>/stat (utime+stime+cutime+cstime, 10 ms
  ticks) / messages; store commands per message (Valkey INFO commandstats: script
  inner commands count too) and round trips (INFO total_reads_processed: one per
  request or pipeline). *lone*: (fake model got the request − message handed to botd:
  served by getUpdates / webhook POST sent / Socket Mode envelope sent / Events API POST
  sent / line written) + (answer seen by the platform − the model's last byte).
* idle — ``--idle-s`` seconds with nothing to do: CPU ms/s and store traffic.
* burst — for each ``--burst-latency-ms``: ``--burst`` new chats send one message at
  the same moment; time until all are answered, p50/p99 per chat (from the burst start).
* load — ``--sessions`` chats at once × ``--session-messages`` messages each (the next
  once the previous answer arrived) at ``--load-latency-ms``, against the ideal.
* memory — in a botd of its own (so the load's peak does not count), direct messages
  open to anyone: ``--memory-sessions`` new chats, one message each, ``--memory-in-flight``
  at a time, LLM latency 0; RSS of botd and of its Valkey ``--settle-s`` after the last
  answer, and the store's ``used_memory`` per session. Not on the console (one chat).

The tree's RSS is also read at the end of the other parts. ``--lived-in`` starts each
botd with the workspace files a workspace in use holds for the system prompt (its
persona, memory and notes on the user, 12 KB); by default the workspace is empty. Prints
a table and writes bench/paths.json.

    .venv/bin/python bench/paths.py [--paths telegram-polling,slack-socket,...]
        [--parts cpu,lone,idle,burst,load,memory] [--messages 100] [--burst 200]
        [--burst-latency-ms 0,500] [--sessions 1000] [--session-messages 5]
        [--load-latency-ms 500] [--idle-s 20] [--memory-sessions 10000]
        [--memory-in-flight 100] [--settle-s 3] [--lived-in] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from bench.common import (  # noqa: E402
    LIVED_IN_FILES,
    fake_llm_subprocess,
    lived_in,
    mib,
    report_header,
    table,
    temp_workspace,
    write_json,
)
from bench.paths_parts import (  # noqa: E402
    SEQUENTIAL_CHATS,
    Bench,
    part_burst,
    part_idle,
    part_load,
    part_memory,
    part_sequential,
    warm_up,
)
from bench.paths_probes import LogTail, StoreProbe, log_events, tree_cpu  # noqa: E402
from bench.paths_rig import PATHS, base_config, open_path  # noqa: E402

OUTPUT = ROOT / "bench" / "paths.json"
PARTS = ("cpu", "lone", "idle", "burst", "load", "memory")
WARMUP_CHATS = 3  # one message each before anything is measured
QUICK = {"messages": 20, "warmup": 5, "burst": 50, "sessions": 50, "session_messages": 2, "idle_s": 3.0,
         "memory_sessions": 200}


class DroppedRequests(logging.Handler):
    """Counts the requests botd dropped before the fake platform had read them (aiohttp
    logs each as "Error handling request"), instead of printing a traceback for each."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


DROPPED = DroppedRequests()


async def measure_path(name: str, args: argparse.Namespace, llm: Any, http: aiohttp.ClientSession,
                       tmp: Path, result: dict[str, Any]) -> None:
    """Fills ``result`` part by part, so what was measured survives a later failure."""
    parts = set(args.parts)
    console = name == "console"
    if parts - {"memory"}:
        sessions = WARMUP_CHATS + SEQUENTIAL_CHATS + args.burst * len(args.burst_latency_ms) + args.sessions
        async with measured(name, args, llm, http, tmp / name, sessions, result) as b:
            if parts & {"cpu", "lone"}:
                result["sequential"] = await part_sequential(b, args.messages, args.warmup)
                show(name, "sequential", result["sequential"])
            if "idle" in parts:
                result["idle"] = await part_idle(b, args.idle_s)
                show(name, "idle", result["idle"])
            if "burst" in parts and not console:
                result["burst"] = []
                for latency in args.burst_latency_ms:
                    result["burst"].append(await part_burst(b, args.burst, latency))
                    show(name, f"burst at {latency:g} ms", result["burst"][-1])
            if "load" in parts and not console:
                result["load"] = await part_load(b, args.sessions, args.session_messages, args.load_latency_ms)
                show(name, "load", result["load"])
            result["tree_rss_mib"] = mib(tree_cpu(b.path.pid).rss)
    if "memory" in parts and not console:
        # A botd of its own: what 10,000 sessions leave behind, not what the load's peak did.
        result["memory"] = memory = {}
        async with measured(name, args, llm, http, tmp / f"{name}-memory", None, memory) as b:
            memory |= await part_memory(b, args.memory_sessions, args.memory_in_flight, args.settle_s)
            show(name, "memory", memory)


@contextlib.asynccontextmanager
async def measured(name: str, args: argparse.Namespace, llm: Any, http: aiohttp.ClientSession, workdir: Path,
                   sessions: int | None, result: dict[str, Any]) -> AsyncIterator[Bench]:
    """One botd on ``name``, warmed up, with what reads it; its log's events go to ``result``."""
    await asyncio.to_thread(workdir.mkdir)
    config = base_config(workdir / "ws", llm, args.max_concurrent_runs, args.debounce_ms)
    if args.lived_in:
        await asyncio.to_thread(lived_in, workdir / "ws")
    async with http.post(f"{llm.root}/_fake/reset") as resp:
        resp.raise_for_status()
    dropped = DROPPED.count
    async with open_path(name, workdir, config, sessions, http, args.redeliver_s) as path:
        store = StoreProbe(path.workspace)
        b = Bench(path, llm, http, store, LogTail(path.log_path), args.reply_timeout)
        try:
            for session in b.fresh(WARMUP_CHATS):  # imports, connections, caches: not measured
                await warm_up(b, session)
            yield b
            result["requests_dropped_by_botd"] = DROPPED.count - dropped
        finally:
            await store.close()
            log_path = path.log_path
    result["log_events"] = log_events(log_path)
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log_path, args.log_dir / f"{workdir.name}.log")


def show(name: str, part: str, r: dict[str, Any]) -> None:
    keep = {k: v for k, v in r.items() if not isinstance(v, dict | list)}  # the rest is in the JSON
    print(f"{name} {part}: {keep}", flush=True)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = report_header("paths", "bench/paths.py")
    report["config"] = {"max_concurrent_runs": args.max_concurrent_runs,
                        "debounce_ms": "botd's default" if args.debounce_ms is None else args.debounce_ms,
                        "workspace_files": LIVED_IN_FILES if args.lived_in else {}}
    report["paths"] = {}
    with temp_workspace("botd-paths-") as tmp:
        async with fake_llm_subprocess(0) as llm, aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=600)
        ) as http:
            for name in args.paths:
                print(f"== {name}", flush=True)
                try:
                    report["paths"][name] = {"path": name}
                    await measure_path(name, args, llm, http, tmp, report["paths"][name])
                except Exception as exc:  # one broken path must not hide the others' figures
                    print(f"{name}: FAILED: {exc!r}", file=sys.stderr, flush=True)
                    report["paths"][name]["error"] = repr(exc)[:2000]
    return report


# ---- the table ----------------------------------------------------------------------------


def rows(report: dict[str, Any]) -> list[list[Any]]:
    nan = float("nan")
    out = []
    for name, r in report["paths"].items():
        if "error" in r and not set(r) - {"path", "error"}:
            out.append([name, "failed: " + r["error"][:60]])
            continue
        if "error" in r:
            name += " (then failed)"
        seq, idle, load = r.get("sequential") or {}, r.get("idle") or {}, r.get("load") or {}
        lone = seq.get("lone", {}).get("total", {})
        bursts = [f"{x['latency_ms']:g}: {x['all_answered_s'] if x['all_answered_s'] is not None else 'missing'}"
                  f" ({x['answer_s']['p50_s']}/{x['answer_s']['p99_s']})" for x in r.get("burst", [])]
        out.append([
            name, seq.get("cpu_ms_per_message_p50", nan), seq.get("cpu_ms_per_message", nan),
            seq.get("store_commands_per_message", nan), seq.get("store_round_trips_per_message", nan),
            lone.get("p50_ms", nan), lone.get("p99_ms", nan), "; ".join(bursts) or "–",
            load_cell(load),
            load.get("cpu_ms_per_message", nan), idle.get("cpu_ms_per_s_exact", nan), r.get("tree_rss_mib", nan),
            memory_cell(r.get("memory") or {}),
        ])
    return out


def load_cell(load: dict[str, Any]) -> str:
    if not load:
        return "–"
    lost = load["missing"] + load.get("refused", 0)
    return f"{load['seconds']} s = {load['vs_ideal']}×" + (f" ({lost} unanswered)" if lost else "")


def memory_cell(memory: dict[str, Any]) -> str:
    after = memory.get("after")
    if not after:
        return "–"
    lost = memory["missing"] + memory["refused"]
    return (f"{after['botd_rss_mib']} + {after['store_rss_mib']} = {after['tree_rss_mib']}"
            + (f" ({lost} unanswered)" if lost else ""))


HEADERS = ("path", "CPU ms/msg p50", "CPU ms/msg total", "store cmds/msg", "round trips/msg", "lone p50 ms",
           "lone p99 ms", "burst: all answered s (p50/p99)", "load vs ideal", "load CPU ms/msg", "idle ms/s",
           "RSS MiB at the end", "RSS MiB after 10,000 sessions: botd + store")


def print_table(report: dict[str, Any]) -> None:
    body = rows(report)
    print()
    print(table(HEADERS, [r + [""] * (len(HEADERS) - len(r)) for r in body]))
    for name, r in report["paths"].items():
        lone = (r.get("sequential") or {}).get("lone")
        if lone:
            print(f"{name}: lone = to LLM p50 {lone['to_llm']['p50_ms']} ms + from LLM p50 "
                  f"{lone['from_llm']['p50_ms']} ms; store by command per message: "
                  + ", ".join(f"{k} {v:g}" for k, v in list(r["sequential"]["store_commands_by_name"].items())[:8]))
            calls = r["sequential"].get("platform_calls_per_message") or {}
            if calls:
                print(f"{name}: platform calls per message: " + ", ".join(f"{k} {v:g}" for k, v in calls.items()))
        trouble = {k: v for k, v in (r.get("log_events") or {}).items() if "(" in k or "failed" in k}
        if trouble:
            print(f"{name}: log events: {trouble}")


def main() -> None:
    def names(choices: tuple[str, ...]) -> Any:
        def parse(text: str) -> list[str]:
            chosen = [x.strip() for x in text.split(",") if x.strip()]
            unknown = set(chosen) - set(choices)
            if unknown:
                raise argparse.ArgumentTypeError(f"unknown: {', '.join(sorted(unknown))} (known: {', '.join(choices)})")
            return chosen
        return parse

    floats = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--paths", type=names(PATHS), default=list(PATHS))
    parser.add_argument("--parts", type=names(PARTS), default=list(PARTS))
    parser.add_argument("--messages", type=int, default=100, help="sequential messages (cpu, lone)")
    parser.add_argument("--warmup", type=int, default=10, help="sequential messages not measured")
    parser.add_argument("--burst", type=int, default=200, help="new chats at once")
    parser.add_argument("--burst-latency-ms", type=floats, default=[0.0, 500.0])
    parser.add_argument("--sessions", type=int, default=1000, help="chats at once (load)")
    parser.add_argument("--session-messages", type=int, default=5, help="messages per chat (load)")
    parser.add_argument("--load-latency-ms", type=float, default=500.0)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--memory-sessions", type=int, default=10_000, help="new chats, one message each (memory)")
    parser.add_argument("--memory-in-flight", type=int, default=100, help="chats waiting on an answer at once (memory)")
    parser.add_argument("--settle-s", type=float, default=3.0, help="quiet seconds before the memory reading")
    parser.add_argument("--max-concurrent-runs", type=int, default=2000, help="gateway.max_concurrent_runs")
    parser.add_argument("--debounce-ms", type=int, default=None, help="queue.debounce_ms (default: botd's own)")
    parser.add_argument("--lived-in", action="store_true",
                        help="the workspace holds IDENTITY.md, SOUL.md, MEMORY.md and USER.md (12 KB)")
    parser.add_argument("--reply-timeout", type=float, default=180.0, help="seconds to wait for one answer")
    parser.add_argument("--redeliver-s", type=float, default=1.0,
                        help="Slack: seconds before an event botd refused is delivered again (Slack: minutes)")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep each path's botd log here")
    parser.add_argument("--quick", action="store_true", help="small sizes (one path in well under a minute)")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    if min(args.messages, args.burst, args.sessions, args.session_messages, args.memory_sessions,
           args.memory_in_flight) < 1 or args.warmup < 0:
        parser.error("sizes must be >= 1 (warm-up >= 0)")
    if (args.session_messages > 999 or WARMUP_CHATS + args.memory_sessions > 99999
            or WARMUP_CHATS + SEQUENTIAL_CHATS + args.burst * len(args.burst_latency_ms) + args.sessions > 99999):
        parser.error("at most 999 messages per chat and 99,999 chats in all")
    server_log = logging.getLogger("aiohttp.server")
    server_log.addHandler(DROPPED)
    server_log.propagate = False
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop botd, the fakes and Valkey
    report = asyncio.run(run(args))
    report["args"] = {k: v for k, v in vars(args).items() if k != "output"}
    print_table(report)
    write_json(args.output, report)


if __name__ == "__main__":
    main()
