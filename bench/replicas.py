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
import contextlib
import itertools
import json
import os
import re
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import psutil  # noqa: E402

from bench.common import (  # noqa: E402
    FakeLLM,
    cpu_seconds,
    fake_llm_subprocess,
    percentile,
    redis_url_from_env,
    report_header,
    summary_ms,
    table,
    write_json,
)
from bot.config import RedisConfig  # noqa: E402
from bot.store.connection import RedisHandle, open_redis  # noqa: E402
from tests.e2e.botd_process import BotdProcess, botd_run, free_port, write_config  # noqa: E402
from tests.e2e.chat_rig import EVENTS_PATH, post_slack, slack_dm_body  # noqa: E402
from tests.fakes.slack_server import FakeSlack  # noqa: E402

OUTPUT = ROOT / "bench" / "replicas.json"
# Fixed width, so a preview cut inside a marker never matches a whole one.
MARK = re.compile(r"\bmk\d{5}x\d{3}\b")
WARMUP_BASE = 90000  # session numbers of the warm-up chats
QUICK = {"sessions": 20, "messages": 3, "latency_ms": 200.0, "warmup": 2}


def mark_of(session: int, message: int) -> str:
    return f"mk{session:05d}x{message:03d}"


def user_of(session: int) -> str:
    return f"UB{session:05d}"


def message_text(session: int, message: int) -> str:
    # The marker comes last: a bot message holding it holds the whole echoed answer.
    return f"ss{session:05d} message {message} please confirm {mark_of(session, message)}"


class WatchedSlack(FakeSlack):
    """The fake Slack, resolving a future when a bot message first holds a marker
    (``chat.postMessage`` or ``chat.update``: a preview that already shows the whole
    answer counts, since that is when the user sees it)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.waiting: dict[str, asyncio.Future[float]] = {}

    def expect(self, mark: str) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[mark] = fut
        return fut

    def _seen(self, args: dict[str, Any], result: dict[str, Any]) -> None:
        if not result.get("ok"):
            return
        now = time.perf_counter()
        for mark in MARK.findall(str(args.get("text") or "")):
            fut = self.waiting.pop(mark, None)
            if fut is not None and not fut.done():
                fut.set_result(now)

    def _m_chat_postMessage(self, args: dict[str, Any]) -> dict[str, Any]:
        result = super()._m_chat_postMessage(args)
        self._seen(args, result)
        return result

    def _m_chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        result = super()._m_chat_update(args)
        self._seen(args, result)
        return result

    def answers_per_mark(self) -> Counter[str]:
        """Bot messages (as they stand now) holding each marker."""
        counts: Counter[str] = Counter()
        for message in self.messages.values():
            if message.get("user") == self.bot_user_id:
                counts.update(set(MARK.findall(str(message.get("text") or ""))))
        return counts


# ---- the replicas -------------------------------------------------------------------


def replica_config(
    workspace: Path, port: int, llm: FakeLLM, slack: FakeSlack, redis_url: str, prefix: str,
    users: list[str], args: argparse.Namespace,
) -> dict[str, Any]:
    return {
        "agent": {"workspace": str(workspace)},
        "llm": {"base_url": llm.base_url, "api_key": "bench-key", "request_timeout_s": 120},
        "redis": {"url": redis_url, "prefix": prefix},
        "http": {"port": port},
        "queue": {"debounce_ms": 0},
        "gateway": {"max_concurrent_runs": args.max_concurrent_runs, "shutdown_grace_s": 10},
        "log": {"level": args.log_level},
        "telegram": {"enabled": False},
        "slack": {
            "enabled": True,
            "mode": "http",
            "bot_token": slack.bot_token,
            "signing_secret": slack.signing_secret,
            "api_base_url": slack.api_url,
            "events_path": EVENTS_PATH,
            "allow_from": users,
        },
    }


async def wait_ready(bot: BotdProcess, within_s: float = 60.0) -> None:
    await bot.wait_healthy(within_s)
    deadline = time.monotonic() + within_s
    while True:
        status, body = await bot.get("/readyz")
        if status == 200:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{bot.url} not ready: {body}\n{bot.log()[-3000:]}")
        await asyncio.sleep(0.1)


def log_summary(bot: BotdProcess, since: int) -> dict[str, Any]:
    """Runs finished, and warning/error events, in a replica's JSON log after offset ``since``."""
    runs = 0
    trouble: Counter[str] = Counter()
    with bot.log_path.open("rb") as f:
        f.seek(since)
        for raw in f:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            name = str(event.get("event", ""))
            if name == "run.finished":
                runs += 1
            if event.get("level") in ("warning", "error", "critical") or name in ("run.resuming", "run.cancelling"):
                trouble[f"{name}:{event['reason']}" if "reason" in event else name] += 1
    return {"runs": runs, "log_events": dict(sorted(trouble.items()))}


# ---- measurements -------------------------------------------------------------------


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent not idle (all cores)."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def proc_cpu(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    try:
        return cpu_seconds(pid)
    except psutil.Error:
        return float("nan")


def unanswered_marks(body: dict[str, Any]) -> list[str]:
    """The markers of the user messages after the last assistant message of a request."""
    marks: list[str] = []
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            marks = []
        elif message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            marks += MARK.findall(str(content or ""))
    return marks


async def command_calls(redis: RedisHandle) -> dict[str, int]:
    """Calls per command name so far (INFO commandstats; the INFO calls themselves included)."""
    stats = await redis.client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if isinstance(v, dict)}


async def llm_requests(http: aiohttp.ClientSession, llm: FakeLLM) -> list[dict[str, Any]]:
    async with http.get(f"{llm.root}/_fake/requests") as resp:
        resp.raise_for_status()
        return list((await resp.json())["requests"])


async def llm_reset(http: aiohttp.ClientSession, llm: FakeLLM) -> None:
    async with http.post(f"{llm.root}/_fake/reset") as resp:
        resp.raise_for_status()


def seconds_summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_s": round(percentile(values, 50), 3),
        "p90_s": round(percentile(values, 90), 3),
        "p99_s": round(percentile(values, 99), 3),
        "max_s": round(max(values), 3) if values else float("nan"),
    }


# ---- one replica count --------------------------------------------------------------


async def measure(
    count: int, args: argparse.Namespace, tmp: Path, llm: FakeLLM, redis: RedisHandle, redis_url: str,
    valkey_pid: int | None, http: aiohttp.ClientSession,
) -> dict[str, Any]:
    prefix = f"benchrep{count}x{uuid.uuid4().hex[:6]}"
    run_dir = tmp / f"r{count}"
    run_dir.mkdir()
    sessions = list(range(args.sessions))
    warm_sessions = [WARMUP_BASE + i for i in range(count)]
    users = [user_of(s) for s in sessions + warm_sessions]
    total = args.sessions * args.messages

    slack = WatchedSlack()
    async with slack, contextlib.AsyncExitStack() as stack:
        ports = [free_port() for _ in range(count)]
        bots: list[BotdProcess] = []
        for i, port in enumerate(ports):
            config = replica_config(run_dir / f"ws-{i}", port, llm, slack, redis_url, prefix, users, args)
            path = write_config(run_dir / f"botd-{i}.yaml", config)
            bots.append(await stack.enter_async_context(botd_run(path, port, run_dir)))
        await asyncio.gather(*(wait_ready(b) for b in bots))

        # Warm-up: each replica answers a few messages of its own chat (imports, pools).
        for bot, session in zip(bots, warm_sessions, strict=True):
            for m in range(args.warmup):
                fut = slack.expect(mark_of(session, m))
                status = await post_slack(http, bot.url, slack, slack_dm_body(slack, user_of(session), message_text(session, m)))
                if status != 200:
                    raise RuntimeError(f"warm-up event refused by {bot.url}: {status}")
                await asyncio.wait_for(fut, args.reply_timeout)
        await asyncio.sleep(1.0)  # let the warm-up runs finish their bookkeeping
        await llm_reset(http, llm)

        pids = [b.proc.pid for b in bots]
        offsets = [b.log_path.stat().st_size for b in bots]
        commands0 = int((await redis.client.info("stats"))["total_commands_processed"])
        calls0 = await command_calls(redis)
        cpu0: dict[str, Any] = {"replicas": [proc_cpu(p) for p in pids], "llm": proc_cpu(llm.pid), "valkey": proc_cpu(valkey_pid),
                "driver": cpu_seconds()}
        busy0 = busy_cpu_seconds()
        load0 = os.getloadavg()

        rr = itertools.count()
        latencies: list[float] = []
        acks: list[float] = []
        refused: list[tuple[str, int]] = []
        missing: list[str] = []
        last_reply = [0.0]

        async def chat(session: int) -> None:
            for m in range(args.messages):
                mark = mark_of(session, m)
                fut = slack.expect(mark)
                bot = bots[next(rr) % count]
                body = slack_dm_body(slack, user_of(session), message_text(session, m))
                sent = time.perf_counter()
                try:
                    status = await post_slack(http, bot.url, slack, body)
                except (aiohttp.ClientError, OSError) as exc:
                    refused.append((mark, -1))
                    print(f"POST to {bot.url} failed: {exc!r}", file=sys.stderr, flush=True)
                    return
                acks.append(time.perf_counter() - sent)
                if status != 200:
                    refused.append((mark, status))
                    return
                try:
                    replied = await asyncio.wait_for(fut, args.reply_timeout)
                except TimeoutError:
                    missing.extend(mark_of(session, k) for k in range(m, args.messages))
                    return
                latencies.append(replied - sent)
                last_reply[0] = max(last_reply[0], replied)

        started = time.perf_counter()
        await asyncio.gather(*(chat(s) for s in sessions))
        seconds = (last_reply[0] or time.perf_counter()) - started
        await asyncio.sleep(args.settle)  # room for a duplicate, if one were coming

        cpu1: dict[str, Any] = {"replicas": [proc_cpu(p) for p in pids], "llm": proc_cpu(llm.pid), "valkey": proc_cpu(valkey_pid),
                "driver": cpu_seconds()}
        busy = busy_cpu_seconds() - busy0
        window = time.perf_counter() - started
        load1 = os.getloadavg()
        commands = int((await redis.client.info("stats"))["total_commands_processed"]) - commands0 - 2
        calls1 = await command_calls(redis)
        per_command = {name: round((n - calls0.get(name, 0)) / total, 2) for name, n in calls1.items()}
        per_command = {k: v for k, v in sorted(per_command.items(), key=lambda kv: -kv[1]) if v >= 0.01}

        # Exactly once: one answer per message in Slack, one model request per message.
        measured = {mark_of(s, m) for s in sessions for m in range(args.messages)}
        answers = slack.answers_per_mark()
        requests = await llm_requests(http, llm)
        asked: Counter[str] = Counter(mk for body in requests for mk in unanswered_marks(body))
        not_answered = sorted(mk for mk in measured if answers[mk] == 0)
        answered_twice = sorted(mk for mk in measured if answers[mk] > 1)
        asked_twice = sorted(mk for mk in measured if asked[mk] > 1)
        never_asked = sorted(mk for mk in measured if asked[mk] == 0)
        api_calls = Counter(c.method for c in slack.calls)

        logs = [log_summary(b, off) for b, off in zip(bots, offsets, strict=True)]
        codes = await asyncio.gather(*(b.terminate() for b in bots))

    replica_cpu = [round(b - a, 2) for a, b in zip(cpu0["replicas"], cpu1["replicas"], strict=True)]
    others = {k: round(cpu1[k] - cpu0[k], 2) for k in ("llm", "valkey", "driver")}
    ours = sum(replica_cpu) + sum(v for v in others.values() if v == v)
    ideal = args.messages * args.latency_ms / 1000
    exactly_once = not (not_answered or answered_twice or asked_twice or never_asked or missing or refused)
    return {
        "replicas": count,
        "sessions": args.sessions,
        "messages_per_session": args.messages,
        "messages": total,
        "latency_ms": args.latency_ms,
        "max_concurrent_runs_per_replica": args.max_concurrent_runs,
        "seconds": round(seconds, 2),
        "messages_per_s": round(len(latencies) / seconds, 1) if seconds > 0 else float("nan"),
        "ideal_s": round(ideal, 2),
        "vs_ideal": round(seconds / ideal, 1) if ideal > 0 else None,
        "latency": seconds_summary(latencies),
        "event_ack": summary_ms(acks),
        "exactly_once": exactly_once,
        "answered": len(latencies),
        "missing": missing[:20],
        "refused": refused[:20],
        "not_answered_in_slack": not_answered[:20],
        "answered_twice": answered_twice[:20],
        "asked_twice": asked_twice[:20],
        "never_asked": never_asked[:20],
        "model_requests": len(requests),
        "slack_api_calls": dict(sorted(api_calls.items())),
        "cpu_s": {
            "per_replica": replica_cpu,
            "replicas_total": round(sum(replica_cpu), 2),
            "replica_ms_per_message": round(sum(replica_cpu) / total * 1000, 1),
            "fake_llm": others["llm"],
            "valkey": others["valkey"],
            "driver_and_fake_slack": others["driver"],
            "window_s": round(window, 2),
            "machine_busy": round(busy, 2),
            "other_processes": round(busy - ours, 2),
            "cores_available": psutil.cpu_count(),
        },
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in load1],
        "runs_per_replica": [entry["runs"] for entry in logs],
        "log_events_per_replica": [entry["log_events"] for entry in logs],
        "redis_commands_per_message": round(commands / total, 1),
        "redis_calls_per_message": per_command,
        "exit_codes": list(codes),
    }


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
            url = redis_url or (server.url if server is not None else "")
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
