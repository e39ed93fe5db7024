"""The memory part of ``bench/gateway.py``: RSS and Redis growth over many new
sessions, one message each.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

from bench.common import child_pid, mib, rss_bytes
from bench.gateway_rig import TEXT, Bench

# The final reading waits this long after the last reply: what a quiet daemon keeps, after
# the housekeeping that follows a burst (bot.heap checks every 2 s).
SETTLE_S = 3.0


async def part_memory(b: Bench, sessions: int, in_flight: int = 100, settle_s: float = SETTLE_S) -> dict[str, Any]:
    await b.fake_config(0)
    b.channel.keep = False
    gc.collect()
    rss0, redis0 = rss_bytes(), await b.valkey_used_memory()
    step = max(1, sessions // 10)
    checkpoints: list[dict[str, Any]] = [{"sessions": 0, "rss_mib": mib(rss0), "redis_used_mib": mib(redis0)}]
    started = time.perf_counter()
    done = 0
    sem = asyncio.Semaphore(in_flight)

    async def touch(i: int) -> None:
        async with sem:
            await b.one_message(f"mem-{i}", TEXT.format(i=i))

    while done < sessions:
        batch = min(step, sessions - done)
        await asyncio.gather(*(touch(done + j) for j in range(batch)))
        done += batch
        await b.fake_reset()
        gc.collect()
        checkpoints.append(
            {"sessions": done, "rss_mib": mib(rss_bytes()), "redis_used_mib": mib(await b.valkey_used_memory())}
        )
    elapsed = time.perf_counter() - started
    b.channel.keep = True
    valkey = child_pid("valkey-server") or child_pid("redis-server")
    rss_busy, store_busy = rss_bytes(), rss_bytes(valkey) if valkey else 0
    await asyncio.sleep(settle_s)
    rss1, redis1 = rss_bytes(), await b.valkey_used_memory()
    store_rss = rss_bytes(valkey) if valkey else 0
    # Slope over the second half: after warm-up effects (pools, caches) have settled.
    half = checkpoints[len(checkpoints) // 2]
    tail_sessions = checkpoints[-1]["sessions"] - half["sessions"]
    slope = (checkpoints[-1]["rss_mib"] - half["rss_mib"]) * 2**20 / tail_sessions if tail_sessions else 0.0
    return {
        "sessions": sessions,
        "in_flight": in_flight,
        "seconds": round(elapsed, 2),
        "messages_per_s": round(sessions / elapsed, 1),
        "rss_before_mib": mib(rss0),
        "rss_right_after_mib": mib(rss_busy),
        "store_rss_right_after_mib": mib(store_busy),
        "settle_s": settle_s,
        "rss_after_mib": mib(rss1),
        # The whole botd tree: this process and the embedded store (0 for an outside Redis).
        "store_rss_after_mib": mib(store_rss),
        "tree_rss_after_mib": mib(rss1 + store_rss),
        "rss_bytes_per_session": round((rss1 - rss0) / sessions),
        "rss_bytes_per_session_second_half": round(slope),
        "redis_bytes_per_session": round((redis1 - redis0) / sessions),
        "checkpoints": checkpoints,
    }
