"""The overhead part of ``bench/gateway.py``: per-message cost of the gateway at LLM
latency 0, one message at a time, against the same request sent straight through
``LLMClient``.
"""

from __future__ import annotations

import time
from typing import Any

from agent.llm import LLMClient, StreamDelta
from agent.types import Message
from bench.common import RoundTrips, child_pid, cpu_seconds, summary_ms
from bench.gateway_rig import TEXT, Bench


async def part_overhead(b: Bench, n: int, warmup: int) -> dict[str, Any]:
    await b.fake_config(0)
    chats = [f"ov-{i}" for i in range(10)]
    e2e: list[float] = []
    own: list[float] = []
    idle: list[float] = []
    commands = 0
    llm_calls = b.model.calls
    valkey = child_pid("valkey-server") or child_pid("redis-server")
    RoundTrips.install()
    cpu0 = (0.0, 0.0)
    trips0 = 0
    for i in range(warmup + n):
        if i == warmup:
            cpu0 = (cpu_seconds(), cpu_seconds(valkey) if valkey else 0.0)
            trips0 = RoundTrips.count
            commands = await b.redis_commands()
            calls0 = await b.redis_command_calls()
            llm_calls = b.model.calls
        before_model = b.model.seconds
        delivered, to_idle = await b.one_message(chats[i % len(chats)], TEXT.format(i=i))
        if i >= warmup:
            e2e.append(delivered)
            own.append(delivered - (b.model.seconds - before_model))
            idle.append(to_idle)
    trips = RoundTrips.count - trips0 - 1  # less the INFO above
    cpu_bot = cpu_seconds() - cpu0[0]
    cpu_store = (cpu_seconds(valkey) - cpu0[1]) if valkey else 0.0
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
        # Requests sent to the store (a script or a pipeline is one), and the commands
        # the store executed (Valkey counts every command a script runs).
        "store_round_trips_per_message": round(trips / n, 2),
        "redis_commands_per_message": round(commands / n, 1),
        # CPU of the botd process tree (this process + the embedded store), per message.
        "cpu_ms_per_message": round((cpu_bot + cpu_store) * 1000 / n, 2),
        "cpu_ms_per_message_bot": round(cpu_bot * 1000 / n, 2),
        "cpu_ms_per_message_store": round(cpu_store * 1000 / n, 2),
        "redis_commands_by_name": by_command,
        "e2e": e2e_s,
        "own": summary_ms(own),
        "to_idle": summary_ms(idle),
        "bare_client": bare_s,
        "e2e_minus_bare_p50_ms": round(e2e_s["p50_ms"] - bare_s["p50_ms"], 3),
        "e2e_minus_bare_p99_ms": round(e2e_s["p99_ms"] - bare_s["p99_ms"], 3),
    }
