"""One replica count of ``bench/replicas.py``: start the replicas, warm them up, send
the same load of Slack DMs round-robin over them, and measure time, latency,
exactly-once delivery, CPU and Redis commands.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench.common import (
    FakeLLM,
    busy_cpu_seconds,
    command_calls,
    cpu_seconds,
    proc_cpu,
    seconds_summary,
    summary_ms,
)
from bench.replicas_fleet import (
    WARMUP_BASE,
    WatchedSlack,
    llm_requests,
    llm_reset,
    log_summary,
    mark_of,
    message_text,
    replica_config,
    unanswered_marks,
    user_of,
    wait_ready,
)
from bot.store.connection import RedisHandle
from tests.e2e.botd_process import BotdProcess, botd_run, free_port, write_config
from tests.e2e.chat_rig import post_slack, slack_dm_body


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
        calls0 = await command_calls(redis.client)
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
        calls1 = await command_calls(redis.client)
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
