"""The in-process daemon harness of ``bench/gateway.py``: the channel and model the
daemon is given (both timing what passes through them), its config, and ``Bench``, the
handle the measured parts drive it with (submit and wait, the fake model's controls,
Redis counters, the daemon's log).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from agent.llm import DeltaCallback, LLMClient, LLMResponse
from agent.types import Message, RunRequest
from bench.common import command_calls
from bot.config import BotdConfig
from bot.daemon import Daemon
from bot.session_keys import session_key
from tests.fakes.recording_channel import RecordingChannel, Sent

ROOT = Path(__file__).resolve().parents[1]
AGENT_ID = "main"
CHANNEL = "test"
# The fake echoes the last user message: ~90 characters, streamed in 4-character chunks.
TEXT = "Message {i}: please give me a short status update on the nightly deployment, thanks."


# ---- the pieces the daemon is given -----------------------------------------------------


@dataclass
class BenchChannel(RecordingChannel):
    """RecordingChannel that also resolves waiters: per (chat, kind) for parts and notices,
    per run for the first preview. ``keep=False`` stops the recording lists from growing
    (the sent parts, previews, streams opened and discarded): they are the bench's, not
    botd's, and a long run would otherwise count them in botd's RSS."""

    keep: bool = True
    waiters: dict[tuple[str, str], asyncio.Future[float]] = field(default_factory=dict)
    preview_waiters: dict[str, asyncio.Future[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.previews = _PreviewList(self)
        self.opened = _KeptList(self)
        self.discarded = _KeptList(self)

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


class _KeptList(list[Any]):
    """A recording list that grows only while its channel keeps records."""

    def __init__(self, channel: BenchChannel) -> None:
        super().__init__()
        self._channel = channel

    def append(self, item: Any) -> None:
        if self._channel.keep:
            super().append(item)


class _PreviewList(_KeptList):
    def append(self, item: tuple[str, str]) -> None:
        fut = self._channel.preview_waiters.pop(item[0], None)
        if fut is not None and not fut.done():
            fut.set_result(time.perf_counter())
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



def make_config(
    workspace: Path, base_url: str, redis_url: str | None, prefix: str, max_concurrent_runs: int,
    debounce_ms: int = 0,
) -> BotdConfig:
    return BotdConfig(
        agent={"id": AGENT_ID, "workspace": str(workspace)},
        llm={"base_url": base_url, "api_key": "bench-key", "model": "gpt-4o-mini"},
        redis={"url": redis_url, "prefix": prefix},
        queue={"mode": "steer", "debounce_ms": debounce_ms},
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
        worker = self.gateway.workers.tasks.get(req.session_key)  # peeks at the gateway, for "to idle"
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
                         for key, task in list(self.gateway.workers.tasks.items())]
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
        return await command_calls(self.daemon.store.client)

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

