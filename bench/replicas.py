"""Replica scaling: 1 vs 3 ``botd run`` processes on one Redis under the same Slack load.

For each replica count in ``--replicas`` (default ``1,3``) the script starts that many
``botd run`` subprocesses, each with its own workspace and HTTP port, all on one Redis
(one key prefix per replica count) and all talking to one fake Slack and one fake
model:

* Redis: the embedded Valkey (unix socket, AOF on, as botd starts it), started once by
  this script in a temporary workspace and given to every replica as ``redis.url``;
  ``--redis-url``/``REDIS_URL`` measures another server instead.
* Slack in HTTP mode: ``tests/fakes/slack_server.py`` runs in this process and serves
  the Web API; the load is signed Events API POSTs (DMs), spread round-robin over the
  replicas' HTTP ports (this script plays the load balancer), so the messages of one
  chat land on different replicas.
* The model: ``python -m tests.fakes.openai_server`` in its own subprocess (its CPU is
  not in the measured processes), echoing the user's message after ``--latency-ms``
  before the first byte.

Load, the same for every replica count: ``--sessions`` chats at once, each sending
``--messages`` messages one after another (the next once the reply to the previous one
reached the fake Slack). Before it, every replica answers ``--warmup`` messages of its
own (not counted). Config: ``queue.debounce_ms`` 0, everything else botd's defaults
(``gateway.max_concurrent_runs`` 64 per replica, log level info, JSON to a file).

Reported per replica count: completion time (first POST → last reply), messages/s,
the ideal (messages × latency) and the ratio to it; per-message latency (event POST →
the complete answer in a bot message at the fake) and the POST's own answer time;
exactly-once (every message has one answer in Slack and was asked of the model once);
CPU seconds of every replica (psutil), of the fake model, Valkey and this process
(driver + fake Slack), and what else the machine ran meanwhile; runs per replica (from
their logs) and any warning/error log events; Redis commands per message.

    .venv/bin/python bench/replicas.py [--replicas 1,3] [--sessions 200] [--messages 5]
        [--latency-ms 500] [--warmup 3] [--max-concurrent-runs 64] [--redis-url URL] [--quick]

Every wait is bounded (``--reply-timeout`` per message); a message not answered in
time is reported as missing. Prints a table and writes bench/replicas.json.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from bench.common import (  # noqa: E402
    fake_llm_subprocess,
    redis_url_from_env,
    report_header,
    table,
    write_json,
)
from bench.replicas_fleet import WARMUP_BASE  # noqa: E402
from bench.replicas_load import measure  # noqa: E402
from bot.config import RedisConfig  # noqa: E402
from bot.store.connection import open_redis  # noqa: E402

OUTPUT = ROOT / "bench" / "replicas.json"
QUICK = {"sessions": 20, "messages": 3, "latency_ms": 200.0, "warmup": 2}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = report_header("replicas", "bench/replicas.py")
    redis_url = redis_url_from_env(args.redis_url)
    report["server"] = "url" if redis_url else "embedded"
    report["channel"] = "slack (http events)"
    with tempfile.TemporaryDirectory(prefix="botd-rep-", dir="/tmp") as tmp_name:
        tmp = Path(tmp_name)
        redis = await open_redis(RedisConfig(url=redis_url, prefix="benchrep"), tmp / "valkey-ws")
        try:
            server = redis._server  # the embedded server's membership (None with a URL)
            url = redis_url or (server.client_url if server is not None else "")
            valkey_pid = server._process.pid if server is not None and server._process is not None else None
            async with fake_llm_subprocess(args.latency_ms) as llm, aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=60)
            ) as http:
                rows = []
                for count in args.replicas:
                    print(f"== {count} replica(s): {args.sessions} sessions × {args.messages} messages, "
                          f"LLM {args.latency_ms:g} ms", flush=True)
                    row = await measure(count, args, tmp, llm, redis, url, valkey_pid, http)
                    rows.append(row)
                    print(f"   {row['seconds']} s, {row['messages_per_s']} msg/s, exactly once: {row['exactly_once']}, "
                          f"CPU per replica {row['cpu_s']['per_replica']}", flush=True)
            if redis_url:
                async for key in redis.client.scan_iter(match="benchrep*", count=1000):
                    await redis.client.unlink(key)
        finally:
            await redis.close()
    report["results"] = rows
    base = next((r for r in rows if r["replicas"] == 1), None)
    if base is not None:
        report["speedup_vs_1"] = {str(r["replicas"]): round(base["seconds"] / r["seconds"], 2) for r in rows}
    return report


def print_tables(report: dict[str, Any]) -> None:
    rows = report["results"]
    print()
    print(table(
        ["replicas", "seconds", "msg/s", "ideal s", "× ideal", "p50 s", "p99 s", "ack p50 ms", "exactly once",
         "runs per replica"],
        [[r["replicas"], r["seconds"], r["messages_per_s"], r["ideal_s"], r["vs_ideal"], r["latency"]["p50_s"],
          r["latency"]["p99_s"], r["event_ack"]["p50_ms"], "yes" if r["exactly_once"] else "NO",
          "/".join(map(str, r["runs_per_replica"]))] for r in rows],
    ))
    print()
    print(table(
        ["replicas", "CPU s per replica", "replicas ms/msg", "fake LLM s", "Valkey s", "driver+Slack s",
         "machine busy s", "other s", "window s"],
        [[r["replicas"], " / ".join(f"{c:.1f}" for c in r["cpu_s"]["per_replica"]),
          r["cpu_s"]["replica_ms_per_message"], r["cpu_s"]["fake_llm"], r["cpu_s"]["valkey"],
          r["cpu_s"]["driver_and_fake_slack"], r["cpu_s"]["machine_busy"], r["cpu_s"]["other_processes"],
          r["cpu_s"]["window_s"]] for r in rows],
    ))
    for r in rows:
        trouble = [e for e in r["log_events_per_replica"] if e]
        if trouble or not r["exactly_once"]:
            print(f"{r['replicas']} replica(s): log events {r['log_events_per_replica']}; missing {r['missing']}, "
                  f"refused {r['refused']}, twice {r['answered_twice']}/{r['asked_twice']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--replicas", type=lambda s: [int(x) for x in s.split(",")], default=[1, 3],
                        help="replica counts, comma-separated")
    parser.add_argument("--sessions", type=int, default=200, help="chats at once")
    parser.add_argument("--messages", type=int, default=5, help="messages per chat, one after another")
    parser.add_argument("--latency-ms", type=float, default=500.0, help="fake LLM latency before the first byte")
    parser.add_argument("--warmup", type=int, default=3, help="messages per replica before measuring")
    parser.add_argument("--max-concurrent-runs", type=int, default=64, help="gateway.max_concurrent_runs per replica")
    parser.add_argument("--reply-timeout", type=float, default=180.0, help="seconds to wait for one reply")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds to wait for duplicates after the last reply")
    parser.add_argument("--redis-url", default=None, help="default: $REDIS_URL, else the embedded Valkey")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a sanity run")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    if min(args.sessions, args.messages, *args.replicas) < 1 or args.warmup < 0 or args.latency_ms < 0:
        parser.error("sizes must be >= 1 (warm-up and latency >= 0)")
    if args.sessions >= WARMUP_BASE or args.messages > 999:
        parser.error(f"at most {WARMUP_BASE - 1} sessions and 999 messages")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the replicas, the fake and Valkey
    report = asyncio.run(run(args))
    report["args"] = {k: v for k, v in vars(args).items() if k != "output"}
    print_tables(report)
    write_json(args.output, report)


if __name__ == "__main__":
    main()
