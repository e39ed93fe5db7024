"""The stop part of ``bench/gateway.py``: ``/stop`` during a slow streamed answer, timed
to the notice, to the model seeing the disconnect and to the worker being idle.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agent.llm import LLMClient
from bench.common import summary_ms
from bench.gateway_rig import Bench, chat_request
from tests.fakes.openai_server import FakeOpenAI, Reply

STOP_ANSWER = "This answer streams slowly, word by word, and it goes on for quite a while. " * 20


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
                worker = b.gateway.workers.tasks.get(req.session_key)
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
