"""The gateway end to end: per-message overhead, many concurrent chats, /stop, memory.

A whole daemon runs in this process (``bot.daemon.Daemon``: the real gateway, inbox,
locks, agent loop, tools registry and ``openai`` client; no HTTP server, no
scheduler) with the in-process ``RecordingChannel`` as its only channel, a real Redis
(the embedded Valkey in a temporary workspace, or ``--redis-url``/``REDIS_URL``) and
the fake OpenAI server in a subprocess (its CPU is not charged to this process); with
``--lived-in`` the workspace holds the prompt's files as one in use does (12 KB). Logs
are written at ``--log-level`` as JSON lines to a file, as ``botd run`` writes them to
stderr. ``queue.debounce_ms`` is 0 and ``gateway.max_concurrent_runs`` 2000
(``--max-concurrent-runs``).

Parts (in this order, all in one daemon):

* idle — RSS right after start.
* overhead — LLM latency 0; ``--overhead-messages`` messages sent one at a time
  (round robin over 10 chats, so histories grow to a few dozen messages); each waits
  until its worker is idle. *e2e* is ``submit()`` → the reply part delivered to the
  channel; *own* is e2e minus the time spent inside the model client (the HTTP round
  trip and SSE parsing of the fake's answer) for that message; *bare* is the same
  request sent straight through ``LLMClient``, for reference; *to idle* adds what a run
  does after delivery (the last part's mark, the trace, the inbox finish and lock
  release; the history append and usage go with the first part's claim).
* memory — LLM latency 0; ``--memory-sessions`` new chats get one message each (100 in
  flight at a time); RSS after every tenth, right after the last reply and once the
  daemon has been quiet for 3 s (the final figure), and the Redis ``used_memory`` growth.
* concurrency — for each latency in ``--latency-ms``: ``--sessions`` chats at once,
  each sending ``--messages`` messages one after another (the next once the previous
  reply arrived). Completion time against the ideal (messages × latency), messages/s,
  per-message e2e, RSS before/after/peak, CPU seconds of this process, the fake and
  Valkey, and the event-loop lag.
* stop — ``--stop-trials`` times: a slow streamed answer (the fake in this process for
  this part only, so the moment it sees the client hang up is known exactly); once the
  first preview is shown, ``/stop`` is submitted. Time to the "Stopped." notice, to
  the fake seeing the disconnect, and to the worker being idle.

    .venv/bin/python bench/gateway.py [--sessions 1000] [--messages 5] [--latency-ms 500,0]
        [--overhead-messages 300] [--memory-sessions 10000] [--stop-trials 50]
        [--max-concurrent-runs 2000] [--parts overhead,memory,concurrency,stop] [--lived-in] [--quick]

A worker still busy 60 s after the last reply of the concurrency part is reported
(count in the JSON, its await chain on stderr) instead of being waited for.

Prints a table per part and writes bench/gateway.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from agent.llm import LLMClient  # noqa: E402
from bench.common import (  # noqa: E402
    LIVED_IN_FILES,
    child_pid,
    cpu_seconds,
    fake_llm_subprocess,
    lived_in,
    mib,
    redis_url_from_env,
    report_header,
    rss_bytes,
    table,
    temp_workspace,
    write_json,
)
from bench.gateway_concurrency import part_concurrency  # noqa: E402
from bench.gateway_memory import part_memory  # noqa: E402
from bench.gateway_overhead import part_overhead  # noqa: E402
from bench.gateway_rig import CHANNEL, Bench, BenchChannel, TimedModel, make_config  # noqa: E402
from bench.gateway_stop import part_stop  # noqa: E402
from bot.daemon import Daemon  # noqa: E402
from bot.logs import configure_logging  # noqa: E402

OUTPUT = ROOT / "bench" / "gateway.json"
QUICK = {
    "sessions": 100, "messages": 3, "latency_ms": [200.0], "overhead_messages": 50, "overhead_warmup": 10,
    "memory_sessions": 1000, "stop_trials": 10,
}


# ---- driver -----------------------------------------------------------------------------


@contextlib.contextmanager
def logs_to(path: Path, level: str) -> Any:
    """Configure botd's JSON logging with stderr pointed at ``path``."""
    saved = sys.stderr
    with path.open("w") as f:
        sys.stderr = f
        try:
            configure_logging(level, "json")
        finally:
            sys.stderr = saved
        try:
            yield
        finally:
            configure_logging("warning", "json")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = report_header("gateway", "bench/gateway.py")
    parts = set(args.parts)
    with temp_workspace("botd-gwbench-") as tmp, logs_to(log_file := args.log_file or tmp / "botd.log", args.log_level):
        redis_url = redis_url_from_env(args.redis_url)
        prefix = f"bench{int(time.time())}"
        async with fake_llm_subprocess(0) as fake, aiohttp.ClientSession() as http:
            cfg = make_config(tmp / "workspace", fake.base_url, redis_url, prefix, args.max_concurrent_runs,
                              args.debounce_ms)
            if args.lived_in:
                lived_in(tmp / "workspace")
            report["workspace_files"] = LIVED_IN_FILES if args.lived_in else {}
            model = TimedModel(LLMClient(model="gpt-4o-mini", base_url=fake.base_url, api_key="bench-key"))
            channel = BenchChannel()
            daemon = Daemon(cfg, channels={CHANNEL: channel}, model=model, with_http=False, with_scheduler=False)
            await daemon.start()
            assert daemon.store is not None
            report["redis"] = "embedded valkey" if daemon.store.embedded else daemon.store.url
            report["log_level"] = args.log_level
            report["max_concurrent_runs"] = args.max_concurrent_runs
            b = Bench(daemon, channel, model, http, fake.root, fake.pid, log_file)
            try:
                await asyncio.sleep(0.5)
                gc.collect()
                report["idle"] = {"rss_mib": mib(rss_bytes()), "redis_used_mib": mib(await b.valkey_used_memory()),
                                  **idle_cpu(args.idle_s)}
                await asyncio.sleep(args.idle_s)
                report["idle"] |= idle_cpu(args.idle_s, report["idle"])
                print(f"idle: RSS {report['idle']['rss_mib']} MiB, CPU {report['idle']['cpu_ms_per_s']} ms/s "
                      f"(bot {report['idle']['bot_cpu_ms_per_s']}, store {report['idle']['store_cpu_ms_per_s']})",
                      flush=True)
                if "overhead" in parts:
                    report["overhead"] = await part_overhead(b, args.overhead_messages, args.overhead_warmup)
                    print_overhead(report["overhead"])
                if "memory" in parts:
                    report["memory"] = await part_memory(b, args.memory_sessions)
                    print_memory(report["memory"])
                if "concurrency" in parts:
                    report["concurrency"] = []
                    for latency in args.latency_ms:
                        row = await part_concurrency(b, args.sessions, args.messages, latency)
                        report["concurrency"].append(row)
                        print_concurrency([row])
                if "stop" in parts:
                    report["stop"] = await part_stop(b, args.stop_trials)
                    print_stop(report["stop"])
            finally:
                await daemon.stop()
        report["log_bytes"] = log_file.stat().st_size
    return report

def run_seconds(pid: int | None = None) -> float:
    """CPU time of a process's threads, to the nanosecond (``/proc/<pid>/task/*/schedstat``).
    An idle daemon spends a millisecond or two a second: the 10 ms ticks of ``cpu_seconds``
    are too coarse for that over half a minute. Falls back to ``cpu_seconds``."""
    tasks = Path(f"/proc/{pid or os.getpid()}/task")
    try:
        return sum(int((task / "schedstat").read_text().split()[0]) for task in tasks.iterdir()) / 1e9
    except (OSError, ValueError, IndexError):
        return cpu_seconds(pid)


def idle_cpu(seconds: float, start: dict[str, Any] | None = None) -> dict[str, Any]:
    """CPU of the idle daemon tree: the counters now, or (given ``start``) per second since."""
    valkey = child_pid("valkey-server") or child_pid("redis-server")
    now = {"_bot_cpu": run_seconds(), "_store_cpu": run_seconds(valkey) if valkey else 0.0}
    if start is None:
        return now
    bot = (now["_bot_cpu"] - start.pop("_bot_cpu")) * 1000 / seconds
    store = (now["_store_cpu"] - start.pop("_store_cpu")) * 1000 / seconds
    return {"idle_seconds": seconds, "cpu_ms_per_s": round(bot + store, 2), "bot_cpu_ms_per_s": round(bot, 2),
            "store_cpu_ms_per_s": round(store, 2)}


# ---- tables -----------------------------------------------------------------------------


def print_overhead(r: dict[str, Any]) -> None:
    print(f"\nper-message overhead, LLM latency 0, {r['messages']} sequential messages over {r['chats']} chats")
    rows = [
        (name, r[key]["p50_ms"], r[key]["p90_ms"], r[key]["p99_ms"], r[key]["max_ms"])
        for name, key in (("e2e (submit → part delivered)", "e2e"), ("own (e2e − time in model client)", "own"),
                          ("to idle (worker done)", "to_idle"), ("bare LLMClient round trip", "bare_client"))
    ]
    rows.append(("e2e − bare", r["e2e_minus_bare_p50_ms"], float("nan"), r["e2e_minus_bare_p99_ms"], float("nan")))
    print(table(("", "p50 ms", "p90 ms", "p99 ms", "max ms"), rows))
    print(f"CPU per message: {r['cpu_ms_per_message']} ms (bot {r['cpu_ms_per_message_bot']}, "
          f"store {r['cpu_ms_per_message_store']})")
    print(f"store round trips per message: {r['store_round_trips_per_message']}")
    print(f"Redis commands per message: {r['redis_commands_per_message']}; "
          f"request: {r['prompt_messages_last']} messages, {r['tools_in_request']} tools")
    print("  by command: " + ", ".join(f"{k} {v:g}" for k, v in r["redis_commands_by_name"].items()), flush=True)


def print_memory(r: dict[str, Any]) -> None:
    print(f"\nmemory: {r['sessions']} new sessions, one message each ({r['messages_per_s']} msg/s)")
    print(table(("sessions", "RSS MiB", "Redis used MiB"),
                [(c["sessions"], c["rss_mib"], c["redis_used_mib"]) for c in r["checkpoints"]]))
    print(f"RSS right after the last reply: botd {r['rss_right_after_mib']} MiB + store "
          f"{r['store_rss_right_after_mib']} MiB")
    print(f"RSS after, quiet for {r['settle_s']:g} s: botd {r['rss_after_mib']} MiB + store "
          f"{r['store_rss_after_mib']} MiB = {r['tree_rss_after_mib']} MiB")
    print(f"RSS per session: {r['rss_bytes_per_session']} B overall, {r['rss_bytes_per_session_second_half']} B "
          f"over the second half; Redis per session: {r['redis_bytes_per_session']} B", flush=True)


def print_concurrency(rows: list[dict[str, Any]]) -> None:
    print("\nconcurrent sessions")
    print(table(
        ("latency ms", "sessions×msgs", "seconds", "ideal s", "×ideal", "msg/s", "e2e p50", "e2e p99",
         "RSS before", "RSS after", "RSS peak", "CPU ms/msg", "lag p99 ms"),
        [(r["latency_ms"], f"{r['sessions']}×{r['messages_per_session']}", r["seconds"], r["ideal_seconds"],
          r["vs_ideal"] if r["vs_ideal"] is not None else float("nan"), r["messages_per_s"],
          r["e2e"]["p50_ms"], r["e2e"]["p99_ms"], r["rss_before_mib"], r["rss_after_mib"], r["rss_peak_mib"],
          r["cpu_ms_per_message"], r["loop_lag"]["p99_ms"]) for r in rows],
    ))
    for r in rows:
        print(f"  at {r['latency_ms']:g} ms: CPU seconds {r['cpu_seconds']}, {r['llm_calls']} LLM calls, "
              f"{r['redis_commands_per_message']} Redis commands/message, "
              f"{r['redis_connections_after']} Redis connections after")
        print(f"  log events: {r['log_events'] or 'none'}", flush=True)


def print_stop(r: dict[str, Any]) -> None:
    print(f"\n/stop during a slow stream, {r['trials']} trials")
    print(table(("", "p50 ms", "p90 ms", "p99 ms", "max ms"), [
        (name, r[key]["p50_ms"], r[key]["p90_ms"], r[key]["p99_ms"], r[key]["max_ms"])
        for name, key in (("\"Stopped.\" notice", "to_notice"), ("fake LLM sees disconnect", "to_llm_disconnect"),
                          ("worker idle", "to_idle"))
    ]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=1000, help="concurrent chats (concurrency part)")
    parser.add_argument("--messages", type=int, default=5, help="messages per chat, one after another")
    parser.add_argument("--latency-ms", type=lambda s: [float(x) for x in s.split(",")], default=[500.0, 0.0],
                        help="fake LLM latencies for the concurrency part, comma-separated")
    parser.add_argument("--overhead-messages", type=int, default=300)
    parser.add_argument("--overhead-warmup", type=int, default=30)
    parser.add_argument("--memory-sessions", type=int, default=10000)
    parser.add_argument("--stop-trials", type=int, default=50)
    parser.add_argument("--max-concurrent-runs", type=int, default=2000, help="gateway.max_concurrent_runs")
    parser.add_argument("--debounce-ms", type=int, default=0, help="queue.debounce_ms (botd's default: 500)")
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds of idle CPU measured after start")
    parser.add_argument("--parts", type=lambda s: s.split(","), default=["overhead", "memory", "concurrency", "stop"])
    parser.add_argument("--redis-url", default=None, help="default: $REDIS_URL, else the embedded Valkey")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-file", type=Path, default=None, help="keep the daemon's log here (default: discarded)")
    parser.add_argument("--lived-in", action="store_true",
                        help="the workspace holds IDENTITY.md, SOUL.md, MEMORY.md and USER.md (12 KB)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a sanity run")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    if min(args.sessions, args.messages, args.overhead_messages, args.memory_sessions, args.stop_trials) < 1:
        parser.error("sizes must be >= 1")
    unknown = set(args.parts) - {"overhead", "memory", "concurrency", "stop"}
    if unknown:
        parser.error(f"unknown part(s): {', '.join(sorted(unknown))}")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # clean up the fake and Valkey
    report = asyncio.run(run(args))
    report["args"] = {k: v for k, v in vars(args).items() if k != "output"}
    write_json(args.output, report)


if __name__ == "__main__":
    main()
