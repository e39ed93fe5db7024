"""The gateway end to end: per-message overhead, many concurrent chats, /stop, memory.

A whole daemon runs in this process (``bot.daemon.Daemon``: the real gateway, inbox,
locks, agent loop, tools registry and ``openai`` client; no HTTP server, no
scheduler) with the in-process ``RecordingChannel`` as its only channel, a real Redis
(the embedded Valkey in a temporary workspace, or ``--redis-url``/``REDIS_URL``) and
the fake OpenAI server in a subprocess (its CPU is not charged to this process). Logs
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
  does after delivery (history append, usage, trace, inbox finish, lock release).
* memory — LLM latency 0; ``--memory-sessions`` new chats get one message each (100 in
  flight at a time); RSS after every tenth, and the Redis ``used_memory`` growth.
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
        [--max-concurrent-runs 2000] [--parts overhead,memory,concurrency,stop] [--quick]

A worker still busy 60 s after the last reply of the concurrency part is reported
(count in the JSON, its await chain on stderr) instead of being waited for.

Prints a table per part and writes bench/gateway.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from agent.llm import DeltaCallback, LLMClient, LLMResponse, StreamDelta  # noqa: E402
from agent.types import Message, RunRequest  # noqa: E402
from bench.common import (  # noqa: E402
    RssSampler,
    child_pid,
    cpu_seconds,
    fake_llm_subprocess,
    mib,
    redis_url_from_env,
    report_header,
    rss_bytes,
    summary_ms,
    table,
    temp_workspace,
    write_json,
)
from bot.config import BotdConfig  # noqa: E402
from bot.daemon import Daemon  # noqa: E402
from bot.logs import configure_logging  # noqa: E402
from bot.session_keys import session_key  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI, Reply  # noqa: E402
from tests.fakes.recording_channel import RecordingChannel, Sent  # noqa: E402

OUTPUT = ROOT / "bench" / "gateway.json"
AGENT_ID = "main"
CHANNEL = "test"
# The fake echoes the last user message: ~90 characters, streamed in 4-character chunks.
TEXT = "Message {i}: please give me a short status update on the nightly deployment, thanks."
STOP_ANSWER = "This answer streams slowly, word by word, and it goes on for quite a while. " * 20
QUICK = {
    "sessions": 100, "messages": 3, "latency_ms": [200.0], "overhead_messages": 50, "overhead_warmup": 10,
    "memory_sessions": 1000, "stop_trials": 10,
}


# ---- the pieces the daemon is given -----------------------------------------------------


@dataclass
class BenchChannel(RecordingChannel):
    """RecordingChannel that also resolves waiters: per (chat, kind) for parts and notices,
    per run for the first preview. ``keep=False`` stops the recording lists from growing."""

    keep: bool = True
    waiters: dict[tuple[str, str], asyncio.Future[float]] = field(default_factory=dict)
    preview_waiters: dict[str, asyncio.Future[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.previews = _PreviewList(self)

    def expect(self, chat_id: str, kind: str = "part") -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiters[(chat_id, kind)] = fut
        return fut

    def expect_preview(self, run_id: str) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.preview_waiters[run_id] = fut
        return fut

    def _record(self, item: Sent) -> None:
        fut = self.waiters.pop((item.chat_id, item.kind), None)
        if fut is not None and not fut.done():
            fut.set_result(time.perf_counter())
        if self.keep:
            super()._record(item)


class _PreviewList(list[tuple[str, str]]):
    def __init__(self, channel: BenchChannel) -> None:
        super().__init__()
        self._channel = channel

    def append(self, item: tuple[str, str]) -> None:
        fut = self._channel.preview_waiters.pop(item[0], None)
        if fut is not None and not fut.done():
            fut.set_result(time.perf_counter())
        if self._channel.keep:
            super().append(item)


class TimedModel:
    """The daemon's ChatModel: an ``LLMClient`` (swappable) plus the time spent in it."""

    def __init__(self, inner: LLMClient) -> None:
        self.inner = inner
        self.seconds = 0.0
        self.calls = 0

    async def complete(
        self, messages: Sequence[Message], tools: list[dict[str, Any]] | None, on_delta: DeltaCallback | None = None
    ) -> LLMResponse:
        started = time.perf_counter()
        try:
            return await self.inner.complete(messages, tools, on_delta)
        finally:
            self.seconds += time.perf_counter() - started
            self.calls += 1

    async def aclose(self) -> None:
        await self.inner.aclose()


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


def make_config(
    workspace: Path, base_url: str, redis_url: str | None, prefix: str, max_concurrent_runs: int
) -> BotdConfig:
    return BotdConfig(
        agent={"id": AGENT_ID, "workspace": str(workspace)},
        llm={"base_url": base_url, "api_key": "bench-key", "model": "gpt-4o-mini"},
        redis={"url": redis_url, "prefix": prefix},
        queue={"mode": "steer", "debounce_ms": 0},
        gateway={"max_concurrent_runs": max_concurrent_runs},
        telegram={"enabled": False},
        slack={"enabled": False},
        heartbeat={"enabled": False},
    )


def chat_request(chat_id: str, text: str) -> RunRequest:
    return RunRequest(
        session_key=session_key(AGENT_ID, CHANNEL, "dm", chat_id),
        agent_id=AGENT_ID,
        channel=CHANNEL,
        chat_id=chat_id,
        user_id=chat_id,
        user_name="Bench",
        text=text,
    )


@dataclass
class Bench:
    daemon: Daemon
    channel: BenchChannel
    model: TimedModel
    http: aiohttp.ClientSession
    fake_root: str
    fake_pid: int
    log_path: Path

    def log_offset(self) -> int:
        return self.log_path.stat().st_size

    def log_events(self, since: int) -> dict[str, int]:
        """Counts of the log events that tell of trouble, written since offset ``since``."""
        counts: dict[str, int] = {}
        with self.log_path.open("rb") as f:
            f.seek(since)
            for raw in f:
                try:
                    event = json.loads(raw)
                except ValueError:
                    continue
                name = event.get("event", "")
                if event.get("level") in ("warning", "error", "critical") or name in ("run.resuming", "run.cancelling"):
                    key = f"{name}:{event['reason']}" if "reason" in event else name
                    counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))

    @property
    def gateway(self) -> Any:
        assert self.daemon.app is not None
        return self.daemon.app.gateway

    async def fake_config(self, latency_ms: float) -> None:
        async with self.http.post(f"{self.fake_root}/_fake/config", json={"latency_ms": latency_ms}) as resp:
            resp.raise_for_status()

    async def fake_reset(self) -> None:
        """Drop the fake's recorded requests (they would pile up in its process)."""
        async with self.http.post(f"{self.fake_root}/_fake/reset") as resp:
            resp.raise_for_status()

    async def last_fake_request(self) -> dict[str, Any]:
        async with self.http.get(f"{self.fake_root}/_fake/requests") as resp:
            resp.raise_for_status()
            return (await resp.json())["requests"][-1]

    async def one_message(self, chat_id: str, text: str, *, wait_idle: bool = True) -> tuple[float, float]:
        """Submit one message; (seconds to the reply part, seconds until the worker is idle,
        or NaN with ``wait_idle=False``)."""
        req = chat_request(chat_id, text)
        reply = self.channel.expect(chat_id)
        started = time.perf_counter()
        result = await self.gateway.submit(req)
        if result.status != "queued":
            raise RuntimeError(f"submit was not accepted: {result}")
        worker = self.gateway._workers.get(req.session_key)  # peeks at the gateway, for "to idle"
        delivered = await asyncio.wait_for(reply, 300)
        if not wait_idle:
            return delivered - started, float("nan")
        if worker is not None:
            await worker
        return delivered - started, time.perf_counter() - started

    async def wait_idle(self, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Wait until no worker runs; after ``timeout_s`` give up and return the stuck
        workers with where each one waits (so a hang is reported, not waited out)."""
        deadline = time.perf_counter() + timeout_s
        while self.gateway.busy_locally():
            if time.perf_counter() > deadline:
                stuck = [{"session": key, "awaiting": coro_stack(task.get_coro())}
                         for key, task in list(self.gateway._workers.items())]
                print(f"WARNING: {len(stuck)} worker(s) still busy after {timeout_s:g} s; first: "
                      f"{stuck[0]['session']}\n  " + "\n  ".join(stuck[0]["awaiting"]), file=sys.stderr, flush=True)
                return stuck
            await asyncio.sleep(0.01)
        return []

    def clear_records(self) -> None:
        self.channel.sent.clear()
        self.channel.previews.clear()
        self.channel.discarded.clear()

    async def redis_commands(self) -> int:
        """Commands the server has processed so far (INFO itself included: 1 per call)."""
        assert self.daemon.store is not None
        return int((await self.daemon.store.client.info("stats"))["total_commands_processed"])

    async def redis_command_calls(self) -> dict[str, int]:
        """Calls per command name so far (INFO commandstats)."""
        assert self.daemon.store is not None
        stats = await self.daemon.store.client.info("commandstats")
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if isinstance(v, dict)}

    async def redis_clients(self) -> int:
        assert self.daemon.store is not None
        return int((await self.daemon.store.client.info("clients"))["connected_clients"])

    async def valkey_used_memory(self) -> int:
        assert self.daemon.store is not None
        info = await self.daemon.store.client.info("memory")
        return int(info["used_memory"])


def coro_stack(coro: Any) -> list[str]:
    """Where a suspended coroutine waits: its await chain, outermost first."""
    out: list[str] = []
    seen = 0
    while coro is not None and seen < 100:
        seen += 1
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is None:
            if isinstance(coro, asyncio.Future):
                out.append(f"future {coro!r}"[:300])
                coro = coro.get_coro() if isinstance(coro, asyncio.Task) else None
                continue
            break
        out.append(f"{frame.f_code.co_filename.removeprefix(str(ROOT) + '/')}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
    return out


# ---- parts ------------------------------------------------------------------------------


async def part_overhead(b: Bench, n: int, warmup: int) -> dict[str, Any]:
    await b.fake_config(0)
    chats = [f"ov-{i}" for i in range(10)]
    e2e: list[float] = []
    own: list[float] = []
    idle: list[float] = []
    commands = 0
    llm_calls = b.model.calls
    for i in range(warmup + n):
        if i == warmup:
            commands = await b.redis_commands()
            calls0 = await b.redis_command_calls()
            llm_calls = b.model.calls
        before_model = b.model.seconds
        delivered, to_idle = await b.one_message(chats[i % len(chats)], TEXT.format(i=i))
        if i >= warmup:
            e2e.append(delivered)
            own.append(delivered - (b.model.seconds - before_model))
            idle.append(to_idle)
    commands = await b.redis_commands() - commands - 1
    llm_calls = b.model.calls - llm_calls
    calls1 = await b.redis_command_calls()
    by_command = {name: round((calls1[name] - calls0.get(name, 0)) / n, 2) for name in calls1}
    by_command = dict(sorted(((k, v) for k, v in by_command.items() if v >= 0.01 and k != "info"),
                             key=lambda kv: -kv[1]))
    # The same request, straight through the client: what a bare LLM call costs here.
    body = await b.last_fake_request()
    messages = [Message.model_validate(m) for m in body["messages"]]
    tools = body.get("tools")
    client = LLMClient(model="gpt-4o-mini", base_url=f"{b.fake_root}/v1", api_key="bench-key")

    async def ignore(_: StreamDelta) -> None:
        return None

    bare: list[float] = []
    try:
        for i in range(warmup + n):
            started = time.perf_counter()
            await client.complete(messages, tools, ignore)
            if i >= warmup:
                bare.append(time.perf_counter() - started)
    finally:
        await client.aclose()
    await b.fake_reset()
    b.clear_records()
    e2e_s, bare_s = summary_ms(e2e), summary_ms(bare)
    return {
        "messages": n,
        "warmup": warmup,
        "chats": len(chats),
        "prompt_messages_last": len(messages),
        "tools_in_request": len(tools or []),
        # Above n: compactions (a session passing 50 messages), each a summary call and a memory flush.
        "llm_calls": llm_calls,
        "redis_commands_per_message": round(commands / n, 1),
        "redis_commands_by_name": by_command,
        "e2e": e2e_s,
        "own": summary_ms(own),
        "to_idle": summary_ms(idle),
        "bare_client": bare_s,
        "e2e_minus_bare_p50_ms": round(e2e_s["p50_ms"] - bare_s["p50_ms"], 3),
        "e2e_minus_bare_p99_ms": round(e2e_s["p99_ms"] - bare_s["p99_ms"], 3),
    }


async def part_memory(b: Bench, sessions: int, in_flight: int = 100) -> dict[str, Any]:
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
    rss1, redis1 = rss_bytes(), await b.valkey_used_memory()
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
        "rss_after_mib": mib(rss1),
        "rss_bytes_per_session": round((rss1 - rss0) / sessions),
        "rss_bytes_per_session_second_half": round(slope),
        "redis_bytes_per_session": round((redis1 - redis0) / sessions),
        "checkpoints": checkpoints,
    }


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
        "loop_lag": summary_ms(lag.samples),
    }


async def _time_of(awaitable: Any) -> float:
    """Await ``awaitable``; the perf_counter() at which it completed."""
    await awaitable
    return time.perf_counter()


async def part_stop(b: Bench, trials: int) -> dict[str, Any]:
    to_notice: list[float] = []
    to_disconnect: list[float] = []
    to_idle: list[float] = []
    async with FakeOpenAI() as fake:
        subprocess_llm = b.model.inner
        b.model.inner = LLMClient(model="gpt-4o-mini", base_url=fake.base_url, api_key="bench-key")
        try:
            for i in range(trials):
                chat_id = f"stop-{i}"
                fake.script(Reply.text(STOP_ANSWER, chunk_chars=5, chunk_delay_s=0.02))
                req = chat_request(chat_id, "tell me a long story")
                shown = b.channel.expect_preview(req.run_id)
                await b.gateway.submit(req)
                worker = b.gateway._workers.get(req.session_key)
                await asyncio.wait_for(shown, 30)
                await asyncio.sleep(0.05)  # mid-stream
                notice = b.channel.expect(chat_id, "notice")
                disconnects = fake.disconnects.count
                gone = asyncio.create_task(_time_of(fake.disconnects.wait(disconnects + 1, timeout_s=30)))
                started = time.perf_counter()
                result = await b.gateway.submit(chat_request(chat_id, "/stop"))
                if (result.status, result.detail) != ("command", "stop"):
                    raise RuntimeError(f"/stop was not taken as a command: {result}")
                noticed = await asyncio.wait_for(notice, 30)
                gone_at = await gone
                if worker is not None:
                    await worker
                idle = time.perf_counter()
                to_notice.append(noticed - started)
                to_disconnect.append(gone_at - started)
                to_idle.append(idle - started)
                fake.reset()
        finally:
            await b.model.inner.aclose()
            b.model.inner = subprocess_llm
    b.clear_records()
    return {
        "trials": trials,
        "to_notice": summary_ms(to_notice),
        "to_llm_disconnect": summary_ms(to_disconnect),
        "to_idle": summary_ms(to_idle),
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
            cfg = make_config(tmp / "workspace", fake.base_url, redis_url, prefix, args.max_concurrent_runs)
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
                report["idle"] = {"rss_mib": mib(rss_bytes()), "redis_used_mib": mib(await b.valkey_used_memory())}
                print(f"idle: RSS {report['idle']['rss_mib']} MiB", flush=True)
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
    print(f"Redis commands per message: {r['redis_commands_per_message']}; "
          f"request: {r['prompt_messages_last']} messages, {r['tools_in_request']} tools")
    print("  by command: " + ", ".join(f"{k} {v:g}" for k, v in r["redis_commands_by_name"].items()), flush=True)


def print_memory(r: dict[str, Any]) -> None:
    print(f"\nmemory: {r['sessions']} new sessions, one message each ({r['messages_per_s']} msg/s)")
    print(table(("sessions", "RSS MiB", "Redis used MiB"),
                [(c["sessions"], c["rss_mib"], c["redis_used_mib"]) for c in r["checkpoints"]]))
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
          r["bot_cpu_ms_per_message"], r["loop_lag"]["p99_ms"]) for r in rows],
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
    parser.add_argument("--parts", type=lambda s: s.split(","), default=["overhead", "memory", "concurrency", "stop"])
    parser.add_argument("--redis-url", default=None, help="default: $REDIS_URL, else the embedded Valkey")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-file", type=Path, default=None, help="keep the daemon's log here (default: discarded)")
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
