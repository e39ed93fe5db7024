"""Week-long records (a run's saved result, its trace) leave fields at their defaults
out of the stored JSON, and read back equal to what was saved."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from agent.types import Message, RunResult, Usage
from bot.gateway.reply import DeliveryLedger
from bot.store.keys import Keys
from bot.tracing import Trace, TraceStore
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.integration.gateway_harness import running_daemon


async def test_a_saved_result_is_stored_without_defaults_and_reads_back_equal(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    ledger = DeliveryLedger(redis_client, redis_prefix)
    result = RunResult(text="the answer", messages=[Message.user("q"), Message.assistant("the answer")],
                       usage=Usage(prompt_tokens=12, completion_tokens=3), iterations=1)
    await ledger.save_result("run-1", result)
    stored = json.loads(await redis_client.get(Keys(redis_prefix).result("run-1")))
    assert "error" not in stored and "status" not in stored  # None and "completed": defaults
    assert stored["messages"][0] == {"role": "user", "content": "q"}
    assert await ledger.load_result("run-1") == result
    failed = result.model_copy(update={"status": "failed", "error": "boom"})
    await ledger.save_result("run-2", failed)
    assert await ledger.load_result("run-2") == failed


async def test_a_trace_is_stored_without_defaults_and_reads_back_equal(
    redis_client: aioredis.Redis, redis_prefix: str
) -> None:
    traces = TraceStore(redis_client, redis_prefix)
    trace = Trace(run_id="run-3", session_key="s", kind="chat", channel="test")
    trace.span("llm", "gpt-4o-mini", time.time(), prompt_tokens=5)
    trace.status, trace.finished_at = "completed", time.time()
    await traces.save(trace)
    await traces.flush()
    stored = json.loads(await redis_client.get(Keys(redis_prefix).trace("run-3")))
    assert "input" not in stored and "error" not in stored["spans"][0]
    assert await TraceStore(redis_client, redis_prefix).load("run-3") == trace


async def test_a_finished_batch_leaves_no_saved_result_behind(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        fake.script(Reply.text("Kept only while a retry could need it."))
        await bot.send("hi")
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        await bot.wait_idle()
        assert await bot.history()  # the run is recorded...
        results = [key async for key in bot.redis.scan_iter(match=bot.keys.result("*"))]
        assert results == []  # ...and the result a resumed attempt would have used is gone


async def test_only_the_newest_traces_are_kept(
    redis_client: aioredis.Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("bot.tracing.TRACES_KEPT", 3)
    traces = TraceStore(redis_client, redis_prefix)
    for i in range(4):
        await traces.save(Trace(run_id=f"old-{i}", session_key="s", kind="chat", channel="test"))
    await traces.flush()  # one flush pushing past the cap
    for i in range(2):
        await traces.save(Trace(run_id=f"new-{i}", session_key="s", kind="chat", channel="test"))
    await traces.flush()
    await traces.save(Trace(run_id="old-3", session_key="s", kind="chat", channel="test", status="completed"))
    await traces.flush()  # saved again: the newest once more, not counted twice
    fresh = TraceStore(redis_client, redis_prefix)
    assert await fresh.recent() == ["old-3", "new-1", "new-0"]
    for gone in ("old-0", "old-1", "old-2"):
        assert await fresh.load(gone) is None
        assert not await redis_client.exists(Keys(redis_prefix).trace(gone))  # the store does not keep it
    loaded = await fresh.load("old-3")
    assert loaded is not None and loaded.status == "completed"
