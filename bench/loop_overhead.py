"""Agent-loop overhead: turns per second and per-turn cost of ``run_loop``.

The fake OpenAI server runs in a subprocess (so its CPU time is not charged to the
loop) with the LLM latency as a parameter (default 0). A turn is one ``run_loop``
call for one user message: with k tool calls per turn the model answers with k calls
to a trivial in-process tool, then with text (two model calls); with k = 0 it answers
with text at once. Reported per turn: wall time, and the loop's own time (wall time
minus the time spent inside the model client, i.e. tool dispatch, validation, policy,
events and bookkeeping).

    .venv/bin/python bench/loop_overhead.py [--turns 300] [--warmup 30] [--tools 0,1,4] [--latency-ms 0]

Prints a table and writes bench/loop_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from agent.llm import DeltaCallback, LLMClient, LLMResponse
from agent.loop import run_loop
from agent.tools.registry import Tool, ToolContext, ToolOutput, ToolRegistry, ToolSettings
from agent.types import AgentEvent, Message

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "bench" / "loop_overhead.json"


class EchoTool(Tool):
    """The cheapest possible tool: validated arguments straight back."""

    name = "echo"
    description = "Echo the arguments."
    parameters = {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput(json.dumps(args))


class TimedModel:
    """Wraps a ChatModel and adds up the time spent inside ``complete``."""

    def __init__(self, inner: LLMClient) -> None:
        self.inner = inner
        self.seconds = 0.0

    async def complete(
        self, messages: Sequence[Message], tools: list[dict[str, Any]] | None, on_delta: DeltaCallback | None = None
    ) -> LLMResponse:
        started = time.perf_counter()
        try:
            return await self.inner.complete(messages, tools, on_delta)
        finally:
            self.seconds += time.perf_counter() - started

    async def aclose(self) -> None:
        await self.inner.aclose()


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


async def start_fake(latency_ms: float) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.fakes.openai_server", "--port", "0", "--latency-ms", str(latency_ms),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"fake OpenAI server did not start: {line!r}")
    return proc, line.removeprefix("listening on ")


async def script(http: aiohttp.ClientSession, root: str, replies: list[dict[str, Any]]) -> None:
    async with http.post(f"{root}/_fake/reset") as resp:
        resp.raise_for_status()
    async with http.post(f"{root}/_fake/script", json={"replies": replies}) as resp:
        resp.raise_for_status()


async def bench_case(
    http: aiohttp.ClientSession, base_url: str, tool_calls: int, turns: int, warmup: int
) -> dict[str, Any]:
    root = base_url.removesuffix("/v1")
    replies: list[dict[str, Any]] = []
    for _ in range(warmup + turns):
        if tool_calls:
            replies.append({"tool_calls": [{"name": "echo", "arguments": {"i": j}} for j in range(tool_calls)]})
        replies.append({"text": "All done, here is the answer you asked for."})
    await script(http, root, replies)

    client = LLMClient(model="bench", base_url=base_url, api_key="bench", max_retries=0)
    model = TimedModel(client)
    registry = ToolRegistry([EchoTool()])
    ctx = ToolContext(run_id="bench", session_key="agent:main:console:dm:bench", settings=ToolSettings(workspace=ROOT))
    prompt = [Message.system("You are a benchmark."), Message.user("Run the tools and answer.")]
    events = 0

    async def on_event(event: AgentEvent) -> None:
        nonlocal events
        events += 1

    wall: list[float] = []
    own: list[float] = []
    try:
        for i in range(warmup + turns):
            model.seconds = 0.0
            started = time.perf_counter()
            result = await run_loop(prompt, model=model, tools=registry, ctx=ctx, run_id=f"b{i}", on_event=on_event)
            elapsed = time.perf_counter() - started
            if result.status != "completed" or len(result.messages) != (tool_calls + 2 if tool_calls else 1):
                raise RuntimeError(f"unexpected run result: {result.status} {result.error}")
            if i >= warmup:
                wall.append(elapsed)
                own.append(elapsed - model.seconds)
    finally:
        await client.aclose()
    total = sum(wall)
    return {
        "tool_calls_per_turn": tool_calls,
        "turns": turns,
        "turns_per_s": turns / total,
        "turn_ms_p50": percentile(wall, 50) * 1000,
        "turn_ms_p99": percentile(wall, 99) * 1000,
        "loop_own_ms_p50": percentile(own, 50) * 1000,
        "loop_own_ms_p99": percentile(own, 99) * 1000,
        "events_per_turn": events / (warmup + turns),
    }


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    proc, base_url = await start_fake(args.latency_ms)
    try:
        async with aiohttp.ClientSession() as http:
            return [await bench_case(http, base_url, k, args.turns, args.warmup) for k in args.tools]
    finally:
        proc.terminate()
        await proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--tools", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 4])
    parser.add_argument("--latency-ms", type=float, default=0.0, help="fake LLM delay before the first byte")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    if args.turns < 1 or args.warmup < 0 or any(k < 0 for k in args.tools):
        parser.error("--turns must be >= 1, --warmup and --tools >= 0")

    rows = asyncio.run(main_async(args))
    header = f"{'tools/turn':>10} {'turns/s':>9} {'turn p50 ms':>12} {'turn p99 ms':>12} {'loop p50 ms':>12} {'loop p99 ms':>12}"
    print(f"run_loop against the fake OpenAI server, LLM latency {args.latency_ms:g} ms, {args.turns} turns each")
    print(header)
    for r in rows:
        print(
            f"{r['tool_calls_per_turn']:>10} {r['turns_per_s']:>9.1f} {r['turn_ms_p50']:>12.2f} "
            f"{r['turn_ms_p99']:>12.2f} {r['loop_own_ms_p50']:>12.3f} {r['loop_own_ms_p99']:>12.3f}"
        )
    report = {
        "benchmark": "loop_overhead",
        "command": " ".join([".venv/bin/python", "bench/loop_overhead.py", *sys.argv[1:]]),
        "latency_ms": args.latency_ms,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": rows,
    }
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output}")


if __name__ == "__main__":
    main()
