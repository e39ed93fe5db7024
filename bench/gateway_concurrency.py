"""The concurrency part of ``bench/gateway.py``: many chats at once, each sending
messages one after another; completion time, RSS, CPU and event-loop lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from typing import Any

from bench.common import RssSampler, child_pid, cpu_seconds, mib, rss_bytes, summary_ms
from bench.gateway_rig import TEXT, Bench


class LagProbe:
    """Event-loop lag: how late a 20 ms sleep wakes up, sampled during a part."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LagProbe:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            self.samples.append(max(0.0, time.perf_counter() - before - self.interval_s))



async def part_concurrency(b: Bench, sessions: int, messages: int, latency_ms: float) -> dict[str, Any]:
    await b.fake_config(latency_ms)
    b.channel.keep = False
    gc.collect()
    tag = f"c{latency_ms:g}"
    valkey = child_pid("valkey-server") or child_pid("redis-server")
    pids = {"bot": None, "fake_llm": b.fake_pid, "valkey": valkey}
    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items() if name == "bot" or pid}
    rss0 = rss_bytes()
    objects0 = len(gc.get_objects())
    latencies: list[float] = []
    calls0 = b.model.calls
    commands0 = await b.redis_commands()
    log0 = b.log_offset()

    async def chat(s: int) -> None:
        for m in range(messages):
            # Like a user: the next message as soon as the reply is there, while the
            # worker may still be recording the previous run.
            delivered, _ = await b.one_message(f"{tag}-{s}", TEXT.format(i=m), wait_idle=False)
            latencies.append(delivered)

    async with RssSampler() as rss, LagProbe() as lag:
        started = time.perf_counter()
        await asyncio.gather(*(chat(s) for s in range(sessions)))
        elapsed = time.perf_counter() - started
        stuck = await b.wait_idle()
    cpu = {name: round(cpu_seconds(pid) - cpu0[name], 2) for name, pid in pids.items() if name in cpu0}
    rss1 = rss_bytes()
    clients = await b.redis_clients()
    commands = await b.redis_commands() - commands0 - 1
    await b.fake_reset()
    b.channel.keep = True
    gc.collect()
    objects1 = len(gc.get_objects())
    total = sessions * messages
    ideal = messages * latency_ms / 1000
    return {
        "latency_ms": latency_ms,
        "sessions": sessions,
        "messages_per_session": messages,
        "messages": total,
        "llm_calls": b.model.calls - calls0,
        "seconds": round(elapsed, 2),
        "ideal_seconds": round(ideal, 2),
        "vs_ideal": round(elapsed / ideal, 2) if ideal else None,
        "messages_per_s": round(total / elapsed, 1),
        "e2e": summary_ms(latencies),
        "rss_before_mib": mib(rss0),
        "rss_after_mib": mib(rss1),
        "rss_peak_mib": mib(rss.peak),
        "log_events": b.log_events(log0),
        "stuck_workers": len(stuck),
        "stuck_example": stuck[0] if stuck else None,
        "gc_objects_before": objects0,
        "gc_objects_after": objects1,
        "cpu_seconds": cpu,
        "redis_connections_after": clients,
        "redis_commands_per_message": round(commands / total, 1),
        "bot_cpu_ms_per_message": round(cpu["bot"] * 1000 / total, 2),
        # The botd process tree: this process and the embedded store.
        "cpu_ms_per_message": round((cpu["bot"] + cpu.get("valkey", 0.0)) * 1000 / total, 2),
        "loop_lag": summary_ms(lag.samples),
    }
