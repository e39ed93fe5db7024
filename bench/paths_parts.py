"""The parts of ``bench/paths.py``, each measured from outside one running botd: the
path's process tree (/proc), its embedded Valkey's counters, its log, the fake model's
request times and the fake platform's view of the answers."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.common import (
    FakeLLM,
    busy_cpu_seconds,
    cpu_seconds,
    mib,
    percentile,
    proc_cpu,
    seconds_summary,
    summary_ms,
)
from bench.paths_probes import LogTail, StoreCounters, StoreProbe, TreeCPU, tree_cpu
from bench.paths_rig import Path, Refused
from bench.replicas_fleet import MARK, mark_of

SEQUENTIAL_CHATS = 10  # the sequential messages go round robin over this many chats


@dataclass(frozen=True)
class Readings:
    tree: TreeCPU
    store: StoreCounters
    at: float
    driver_s: float  # this process: the driver and the fake platform
    llm_s: float  # the fake model's process
    machine_s: float  # every core's busy time: what else ran meanwhile
    platform: Counter[str]  # platform API calls so far, by method


@dataclass
class Bench:
    """One path under measurement and what reads it."""

    path: Path
    llm: FakeLLM
    http: aiohttp.ClientSession
    store: StoreProbe
    log: LogTail
    reply_timeout_s: float
    sessions: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def fresh(self, n: int) -> list[int]:
        """``n`` session numbers never used before: new chats."""
        return [next(self.sessions) for _ in range(n)]

    async def set_latency(self, ms: float) -> None:
        async with self.http.post(f"{self.llm.root}/_fake/config", json={"latency_ms": ms}) as resp:
            resp.raise_for_status()

    async def llm_timings(self) -> list[dict[str, Any]]:
        async with self.http.get(f"{self.llm.root}/_fake/timings") as resp:
            resp.raise_for_status()
            return list((await resp.json())["timings"])

    async def readings(self) -> Readings:
        return Readings(tree_cpu(self.path.pid), await self.store.counters(), time.monotonic(), cpu_seconds(),
                        proc_cpu(self.llm.pid), busy_cpu_seconds(), self.path.platform_calls())

    async def costs(self, start: Readings, messages: int) -> dict[str, Any]:
        """CPU and store use since ``start``, in total and per message; the CPU seconds of
        this process (driver and fake platform) and of the fake model, to show whether
        either was the bottleneck."""
        end = await self.readings()
        cpu0, cpu1 = start.tree, end.tree
        commands, trips, by_name = StoreProbe.delta(start.store, end.store)
        per = max(messages, 1)
        return {
            "seconds": round(end.at - start.at, 3),
            "cpu_s": round(cpu1.ticks_s - cpu0.ticks_s, 3),
            "driver_cpu_s": round(end.driver_s - start.driver_s, 3),
            "llm_cpu_s": round(end.llm_s - start.llm_s, 3),
            "machine_busy_cpu_s": round(end.machine_s - start.machine_s, 2),
            "cpu_ms_per_message": round((cpu1.ticks_s - cpu0.ticks_s) * 1000 / per, 2),
            "cpu_ms_per_message_exact": round((cpu1.exact_s - cpu0.exact_s) * 1000 / per, 2),
            "store_cpu_ms_per_message": round((cpu1.store_exact_s - cpu0.store_exact_s) * 1000 / per, 2),
            "store_commands_per_message": round(commands / per, 2),
            "store_round_trips_per_message": round(trips / per, 2),
            "store_commands_by_name": {k: round(v / per, 2) for k, v in by_name.most_common()},
            "platform_calls_per_message": {k: round(v / per, 2) for k, v in (end.platform - start.platform).most_common()},
        }

    async def settle(self, runs: int) -> bool:
        """Wait until ``runs`` runs have finished in all (the log says so)."""
        return await self.log.wait_runs(runs, self.reply_timeout_s)

    async def answered(self, futures: dict[str, asyncio.Future[float]]) -> dict[str, float]:
        """The answer times that arrive within the reply timeout (missing ones left out)."""
        done, pending = await asyncio.wait(futures.values(), timeout=self.reply_timeout_s) if futures else ((), ())
        for fut in pending:
            fut.cancel()
        return {mark: fut.result() for mark, fut in futures.items() if fut in done and not fut.cancelled()}


async def warm_up(b: Bench, session: int) -> None:
    """One message, not measured: imports, connections and caches warm up."""
    await exchange(b, session, 1)


async def exchange(b: Bench, session: int, number: int) -> dict[str, float]:
    """Send message ``number`` of chat ``session``; wait for its answer and its run's end."""
    mark = mark_of(session, number)
    runs = b.log.poll()
    fut = b.path.expect(mark)
    await b.path.send(session, number)
    got = await b.answered({mark: fut})
    if not got or not await b.settle(runs + 1):
        raise RuntimeError(f"{b.path.name}: message {mark} was not answered within {b.reply_timeout_s:g} s")
    return got


async def part_sequential(b: Bench, messages: int, warmup: int) -> dict[str, Any]:
    """Messages one at a time (the next once the run of the previous one finished), LLM
    latency 0: CPU of the tree per message, store use, and the lone-message overhead."""
    await b.set_latency(0)
    chats = b.fresh(SEQUENTIAL_CHATS)
    cpu_ms: list[float] = []
    marks: list[str] = []
    answers: dict[str, float] = {}
    start = None
    for i in range(warmup + messages):
        if i == warmup:
            start = await b.readings()
        session, number = chats[i % len(chats)], i // len(chats) + 1
        before = tree_cpu(b.path.pid)
        got = await exchange(b, session, number)
        if i >= warmup:
            cpu_ms.append((tree_cpu(b.path.pid).exact_s - before.exact_s) * 1000)
            marks.append(mark_of(session, number))
            answers |= got
    assert start is not None
    costs = await b.costs(start, messages)
    lone = lone_overhead(b, marks, answers, await b.llm_timings())
    return {"messages": messages, "chats": len(chats), "cpu_ms_per_message_p50": round(percentile(cpu_ms, 50), 2),
            "cpu_ms_per_message_p90": round(percentile(cpu_ms, 90), 2), **costs, "lone": lone}


def lone_overhead(b: Bench, marks: list[str], answers: dict[str, float],
                  timings: list[dict[str, Any]]) -> dict[str, Any]:
    """(fake model got the request − message handed to botd) + (answer at the platform −
    the model's last byte), per message that made exactly one model request."""
    requests: dict[str, list[dict[str, Any]]] = {}
    for t in timings:
        for mark in set(MARK.findall(t["last_user"])):
            requests.setdefault(mark, []).append(t)
    inbound, outbound, total = [], [], []
    folded = 0
    for mark in marks:
        handed, reqs = b.path.handed_at(mark), requests.get(mark, [])
        if handed is None or len(reqs) != 1 or reqs[0]["last_byte"] is None:
            folded += 1
            continue
        into = reqs[0]["arrived"] - handed
        out = answers[mark] - reqs[0]["last_byte"]
        inbound.append(into)
        outbound.append(out)
        total.append(into + out)
    return {"total": summary_ms(total), "to_llm": summary_ms(inbound), "from_llm": summary_ms(outbound),
            "not_one_request": folded}


async def part_idle(b: Bench, seconds: float) -> dict[str, Any]:
    """The quiet daemon: CPU of its tree and store traffic per second."""
    await asyncio.sleep(1.0)  # let the last run's tail (traces, metrics) pass
    start = await b.readings()
    await asyncio.sleep(seconds)
    end = await b.readings()
    cpu0, cpu1 = start.tree, end.tree
    commands, trips, by_name = StoreProbe.delta(start.store, end.store)
    span = end.at - start.at
    return {"seconds": round(span, 2), "cpu_ms_per_s": round((cpu1.ticks_s - cpu0.ticks_s) * 1000 / span, 2),
            "cpu_ms_per_s_exact": round((cpu1.exact_s - cpu0.exact_s) * 1000 / span, 3),
            "store_commands_per_s": round(commands / span, 2), "store_round_trips_per_s": round(trips / span, 2),
            "store_commands_by_name": dict(Counter(by_name).most_common())}


async def part_burst(b: Bench, chats: int, latency_ms: float) -> dict[str, Any]:
    """``chats`` new chats send one message each at the same moment."""
    await b.set_latency(latency_ms)
    sessions = b.fresh(chats)
    futures = {mark_of(s, 1): b.path.expect(mark_of(s, 1)) for s in sessions}
    runs, refusals = b.log.poll(), b.path.refusals
    start = await b.readings()
    began = time.monotonic()
    sent = await asyncio.gather(*(b.path.send(s, 1) for s in sessions), return_exceptions=True)
    refused = [mark_of(s, 1) for s, r in zip(sessions, sent, strict=True) if isinstance(r, Refused)]
    if errors := [r for r in sent if isinstance(r, BaseException) and not isinstance(r, Refused)]:
        raise errors[0]
    for mark in refused:
        futures.pop(mark).cancel()
    got = await b.answered(futures)
    await b.settle(runs + len(got))
    costs = await b.costs(start, chats)
    await b.set_latency(0)
    waits = [t - began for t in got.values()]
    return {"chats": chats, "latency_ms": latency_ms, "answered": len(got), "refused": len(refused),
            "redelivered": b.path.refusals - refusals,
            "missing": chats - len(got) - len(refused),
            "all_answered_s": round(max(waits), 3) if len(got) == chats else None,
            "answer_s": seconds_summary(waits), **costs}


async def part_load(b: Bench, sessions: int, messages: int, latency_ms: float) -> dict[str, Any]:
    """``sessions`` chats at once, each sending ``messages`` one after another (the next
    once the answer to the previous one reached the platform)."""
    await b.set_latency(latency_ms)
    chats = b.fresh(sessions)
    latencies: list[float] = []
    last = [0.0]
    refused: list[str] = []

    async def chat(session: int) -> None:
        for number in range(1, messages + 1):
            mark = mark_of(session, number)
            fut = b.path.expect(mark)
            sent = time.monotonic()
            try:
                await b.path.send(session, number)
            except Refused:
                refused.append(mark)
                fut.cancel()
                return  # the rest of this chat is counted as missing
            got = await b.answered({mark: fut})
            if not got:
                return  # the rest of this chat would wait on it: counted as missing
            latencies.append(got[mark] - sent)
            last[0] = max(last[0], got[mark])

    runs, refusals = b.log.poll(), b.path.refusals
    start = await b.readings()
    began = time.monotonic()
    await asyncio.gather(*(chat(s) for s in chats))
    seconds = last[0] - began
    await b.settle(runs + len(latencies))
    costs = await b.costs(start, len(latencies))
    await b.set_latency(0)
    ideal = messages * latency_ms / 1000
    return {"sessions": sessions, "messages_per_session": messages, "latency_ms": latency_ms,
            "answered": len(latencies), "refused": len(refused), "redelivered": b.path.refusals - refusals,
            "missing": sessions * messages - len(latencies) - len(refused), "seconds": round(seconds, 2),
            "ideal_seconds": ideal, "vs_ideal": round(seconds / ideal, 2) if ideal else None,
            "messages_per_s": round(len(latencies) / seconds, 1) if seconds > 0 else None,
            "latency_s": seconds_summary(latencies), **costs}


async def part_memory(b: Bench, sessions: int, in_flight: int, settle_s: float) -> dict[str, Any]:
    """``sessions`` new chats, one message each, ``in_flight`` at a time, LLM latency 0:
    the tree's RSS as it goes and ``settle_s`` after the last answer (what a quiet daemon
    keeps once the housekeeping after a burst has run), and what the store holds."""
    await b.set_latency(0)
    gate = asyncio.Semaphore(in_flight)
    answered = refused = 0

    async def chat(session: int) -> None:
        nonlocal answered, refused
        async with gate:
            mark = mark_of(session, 1)
            fut = b.path.expect(mark)
            try:
                await b.path.send(session, 1)
            except Refused:
                fut.cancel()
                refused += 1
                return
            got = await b.answered({mark: fut})
            answered += len(got)  # not ``+= len(await …)``: that reads the count before waiting

    def reading(done: int, tree: TreeCPU, used: int) -> dict[str, Any]:
        return {"sessions": done, "tree_rss_mib": mib(tree.rss), "botd_rss_mib": mib(tree.rss - tree.store_rss),
                "store_rss_mib": mib(tree.store_rss), "store_used_mib": mib(used),
                "botd_rss_bytes": tree.rss - tree.store_rss, "store_used_bytes": used}

    runs = b.log.poll()
    start = await b.readings()
    checkpoints = [reading(0, start.tree, await b.store.used_memory())]
    step, done = max(1, sessions // 10), 0
    while done < sessions:
        batch = b.fresh(min(step, sessions - done))
        await asyncio.gather(*(chat(s) for s in batch))
        done += len(batch)
        checkpoints.append(reading(done, tree_cpu(b.path.pid), await b.store.used_memory()))
    await b.settle(runs + answered)
    costs = await b.costs(start, answered)
    await asyncio.sleep(settle_s)
    after = reading(sessions, tree_cpu(b.path.pid), await b.store.used_memory())
    half = checkpoints[len(checkpoints) // 2]
    tail = sessions - half["sessions"]
    return {
        "sessions": sessions, "in_flight": in_flight, "answered": answered, "refused": refused,
        "missing": sessions - answered - refused, "settle_s": settle_s,
        "before": checkpoints[0], "after": after,
        # growth over the second half, after pools and caches have filled
        "botd_rss_bytes_per_session_second_half":
            round((checkpoints[-1]["botd_rss_bytes"] - half["botd_rss_bytes"]) / tail) if tail else None,
        "store_used_bytes_per_session": round((after["store_used_bytes"] - checkpoints[0]["store_used_bytes"])
                                              / sessions),
        "checkpoints": checkpoints, **costs,
    }
