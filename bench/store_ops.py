"""Store costs: latency of the Redis operations on a message's path, and memory per session.

Runs against the embedded Valkey server (unix socket, AOF on) started in a temporary
workspace exactly as botd starts it, or against ``--redis-url``. Each operation runs
sequentially ``--ops`` times (after a warm-up) for p50/p99; ``append (concurrent)``
runs ``--tasks`` tasks appending to their own sessions at once and reports throughput.
Memory per session is the server's ``used_memory`` growth divided by the sessions
created (each with ``--messages`` messages of about 250 characters, plus usage). This
process's CPU per command (botd's client against redis-py's own) and per history read
(parsed whole, and read again with the decoded history kept) close the report.

    .venv/bin/python bench/store_ops.py [--ops 2000] [--sessions 500] [--messages 20] [--tasks 50]

Prints a table and writes bench/store_ops.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agent.types import Message, ToolCall
from bot.config import RedisConfig
from bot.gateway.inbox import Deduper
from bot.store import RedisHandle, RedisKeyValue, SessionLock, SessionStore, open_redis
from bot.store.sessions import DecodedHistories

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "bench" / "store_ops.json"
TEXT = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 4  # ~230 chars


def run_messages(i: int) -> list[Message]:
    """A typical run: the user's message, a tool call and its result, the answer."""
    return [
        Message.user(f"{i} {TEXT}"),
        Message.assistant(
            None, [ToolCall(id=f"call_{i}", name="read_file", arguments='{"path": "notes.md"}')]
        ),
        Message.tool(f"call_{i}", TEXT),
        Message.assistant(TEXT),
    ]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def timed(n: int, warmup: int, op: Callable[[int], Awaitable[Any]]) -> dict[str, float]:
    for i in range(warmup):
        await op(-1 - i)
    samples = []
    for i in range(n):
        start = time.perf_counter()
        await op(i)
        samples.append((time.perf_counter() - start) * 1000)
    return {
        "p50_ms": round(statistics.median(samples), 4),
        "p99_ms": round(percentile(samples, 0.99), 4),
        "ops_per_s": round(n / (sum(samples) / 1000), 1),
    }


async def latency_rows(handle: RedisHandle, n: int) -> list[dict[str, Any]]:
    client, keys = handle.client, handle.keys
    store = SessionStore(client, keys)
    dedupe = Deduper(client, keys)
    kv = RedisKeyValue(client, handle.prefix)
    full = "agent:main:bench:full"
    for r in range(13):  # ~50 messages, a typical history between compactions
        await store.append(full, f"seed-{r}", run_messages(r))
    warm = max(10, n // 20)

    async def append(i: int) -> None:
        await store.append(f"agent:main:bench:append:{i % 200}", uuid.uuid4().hex, run_messages(i))

    async def lock(i: int) -> None:
        async with SessionLock(client, keys, f"agent:main:bench:lock:{i % 50}", ttl_s=30):
            pass

    ops: list[tuple[str, Callable[[int], Awaitable[Any]]]] = [
        ("append (4 messages)", append),
        ("history (52 messages)", lambda i: store.history(full)),
        ("snapshot (52 messages)", lambda i: store.snapshot(full)),
        ("record_usage", lambda i: store.record_usage(full, 1000, 100)),
        ("show", lambda i: store.show(full)),
        ("lock acquire + release", lock),
        ("dedupe claim", lambda i: dedupe.claim(f"bench:{uuid.uuid4().hex}")),
        ("kv set_nx", lambda i: kv.set_nx(f"bench:{i}", "v", 60)),
    ]
    rows = []
    for name, op in ops:
        rows.append({"operation": name, **await timed(n, warm, op)})
    return rows


async def client_cpu_rows(handle: RedisHandle, n: int, rounds: int = 12) -> list[dict[str, Any]]:
    """This process's CPU per command, botd's client against redis-py's own connection
    class and pool on the same server (botd's connections skip the per-write ``wait_for``
    and the timer per buffered reply, its pool the lock and the task per release): short
    runs of ``n`` commands, the two clients taking turns, the median per client (CPU
    time per command swings by a third from run to run on a shared machine)."""
    import redis.asyncio as aioredis

    pool = handle.client.connection_pool
    plain_class = next(c for c in pool.connection_class.__mro__ if c.__module__.startswith("redis."))
    plain = aioredis.Redis(connection_pool=aioredis.ConnectionPool(connection_class=plain_class, **pool.connection_kwargs))
    clients = {"botd's client": handle.client, "redis-py's connection": plain}
    await handle.client.set("bench:cpu", "v")

    async def get(client: Any) -> None:
        await client.get("bench:cpu")

    async def pipeline(client: Any, transaction: bool = False) -> None:
        async with client.pipeline(transaction=transaction) as pipe:
            pipe.get("bench:cpu")
            pipe.get("bench:cpu")
            pipe.hgetall("bench:none")
            await pipe.execute()

    async def transaction(client: Any) -> None:
        await pipeline(client, transaction=True)

    samples: dict[tuple[str, str], list[float]] = {}
    try:
        for round_no in range(rounds + 1):  # the first round warms up
            for what, op in (("GET", get), ("pipeline of 3", pipeline), ("MULTI/EXEC of 3", transaction)):
                for name, client in clients.items():
                    cpu = time.process_time()
                    for _ in range(n):
                        await op(client)
                    if round_no:
                        samples.setdefault((name, what), []).append((time.process_time() - cpu) / n * 1e6)
    finally:
        await plain.aclose()
    # Packing alone, as the inbox intake's EVALSHA (10 arguments): no socket involved.
    packed = ("EVALSHA", "0" * 40, 4, *(f"botd:inbox:agent:main:telegram:dm:{i}" for i in range(4)),
              "x" * 300, "1795541469.3267174", 12)
    for name, cls in (("botd's client", pool.connection_class), ("redis-py's connection", plain_class)):
        conn = cls(**pool.connection_kwargs)
        for round_no in range(rounds + 1):
            cpu = time.process_time()
            for _ in range(n * 10):
                conn.pack_command(*packed)
            if round_no:
                samples.setdefault((name, "pack EVALSHA"), []).append((time.process_time() - cpu) / (n * 10) * 1e6)
    return [{"client": name, "operation": what, "cpu_us_per_op": round(statistics.median(values), 1)}
            for (name, what), values in samples.items()]


async def history_cpu_rows(handle: RedisHandle, n: int, rounds: int = 12) -> list[dict[str, Any]]:
    """This process's CPU to read a history of 52 messages (``run_messages``, ~11 KiB) and
    parse it: whole, by a store that never read it (every read until the fifteenth pass),
    and again, by the store that read it before (its decoded history kept). Short runs of
    ``n`` reads taking turns, the median per way."""
    full = "agent:main:bench:full"
    whole, kept = SessionStore(handle.client, handle.keys), SessionStore(handle.client, handle.keys)
    whole._decoded = DecodedHistories(max_memory=0)  # keeps nothing
    ways: dict[str, Callable[[], Awaitable[Any]]] = {
        "history read, parsed whole": lambda: whole.history(full),
        "history read again, kept": lambda: kept.history(full),
    }
    samples: dict[str, list[float]] = {}
    for round_no in range(rounds + 1):  # the first round warms up
        for what, read in ways.items():
            cpu = time.process_time()
            for _ in range(n):
                await read()
            if round_no:
                samples.setdefault(what, []).append((time.process_time() - cpu) / n * 1e6)
    return [{"operation": what, "cpu_us_per_op": round(statistics.median(values), 1)} for what, values in samples.items()]


async def concurrent_row(handle: RedisHandle, tasks: int, per_task: int) -> dict[str, Any]:
    store = SessionStore(handle.client, handle.keys)

    async def worker(t: int) -> None:
        for i in range(per_task):
            await store.append(f"agent:main:bench:conc:{t}", f"{t}-{i}-{uuid.uuid4().hex}", run_messages(i))

    start = time.perf_counter()
    await asyncio.gather(*(worker(t) for t in range(tasks)))
    seconds = time.perf_counter() - start
    total = tasks * per_task
    return {
        "operation": f"append (concurrent, {tasks} tasks)",
        "p50_ms": None,
        "p99_ms": None,
        "ops_per_s": round(total / seconds, 1),
    }


async def memory_per_session(handle: RedisHandle, sessions: int, messages: int) -> dict[str, Any]:
    store = SessionStore(handle.client, handle.keys)
    prefix = f"agent:main:bench:mem:{uuid.uuid4().hex[:6]}"
    before = int((await handle.client.info("memory"))["used_memory"])
    for s in range(sessions):
        key = f"{prefix}:{s}"
        for r in range(max(1, messages // 4)):
            await store.append(key, f"run-{r}", run_messages(r))
        await store.record_usage(key, 1000, 100, run_id="run-0")
    after = int((await handle.client.info("memory"))["used_memory"])
    per_session = (after - before) / sessions
    stored = max(1, messages // 4) * 4
    k, first = handle.keys, f"{prefix}:0"
    list_bytes = int(await handle.client.memory_usage(k.session_messages(first)) or 0)
    key_bytes = list_bytes
    for key in (k.session_meta(first), k.session_ops(first)):
        key_bytes += int(await handle.client.memory_usage(key) or 0)
    return {
        "sessions": sessions,
        "messages_per_session": stored,
        "bytes_per_session": round(per_session),
        "session_keys_bytes": key_bytes,
        "messages_list_bytes": list_bytes,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="botd-bench-") as tmp:
        start = time.perf_counter()
        handle = await open_redis(RedisConfig(url=args.redis_url, prefix="bench"), Path(tmp))
        open_ms = (time.perf_counter() - start) * 1000
        try:
            rows = await latency_rows(handle, args.ops)
            rows.append(await concurrent_row(handle, args.tasks, max(1, args.ops // args.tasks)))
            memory = await memory_per_session(handle, args.sessions, args.messages)
            client_cpu = await client_cpu_rows(handle, max(20, args.ops // 4))
            history_cpu = await history_cpu_rows(handle, max(20, args.ops // 8))
            if args.redis_url and args.flush:
                await handle.client.flushdb()
        finally:
            start = time.perf_counter()
            await handle.close()
            close_ms = (time.perf_counter() - start) * 1000
    return {
        "server": "url" if args.redis_url else "embedded",
        "open_ms": round(open_ms, 1),
        "close_ms": round(close_ms, 1),
        "results": rows,
        "memory": memory,
        "client_cpu": client_cpu,
        "history_cpu": history_cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--redis-url", default=None, help="default: the embedded server in a temp workspace")
    parser.add_argument("--flush", action="store_true", help="FLUSHDB afterwards (only with --redis-url)")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    if args.ops < 20 or args.sessions < 1 or args.messages < 4 or args.tasks < 1:
        parser.error("--ops >= 20, --sessions >= 1, --messages >= 4, --tasks >= 1")

    report = asyncio.run(main_async(args))
    print(
        f"store operations, {report['server']} server "
        f"(open {report['open_ms']:.0f} ms, close {report['close_ms']:.0f} ms), {args.ops} ops each"
    )
    print(f"{'operation':<34} {'p50 ms':>8} {'p99 ms':>8} {'ops/s':>9}")
    for r in report["results"]:
        p50 = "-" if r["p50_ms"] is None else f"{r['p50_ms']:.3f}"
        p99 = "-" if r["p99_ms"] is None else f"{r['p99_ms']:.3f}"
        print(f"{r['operation']:<34} {p50:>8} {p99:>8} {r['ops_per_s']:>9.0f}")
    mem = report["memory"]
    print(
        f"memory: {mem['bytes_per_session']} bytes per session of {mem['messages_per_session']} messages "
        f"(used_memory growth over {mem['sessions']} sessions); MEMORY USAGE of one session's keys "
        f"{mem['session_keys_bytes']} bytes, {mem['messages_list_bytes']} of them the message list"
    )
    print("client CPU per command (this process): " + "; ".join(
        f"{r['client']} {r['operation']} {r['cpu_us_per_op']} µs" for r in report["client_cpu"]))
    print("CPU per history read (this process): " + "; ".join(
        f"{r['operation']} {r['cpu_us_per_op']} µs" for r in report["history_cpu"]))
    report.update(
        {
            "benchmark": "store_ops",
            "command": " ".join([".venv/bin/python", "bench/store_ops.py", *sys.argv[1:]]),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output}")


if __name__ == "__main__":
    main()
