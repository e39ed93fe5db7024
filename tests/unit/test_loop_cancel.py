"""Cancelling a run: mid-stream, mid-tool (a real subprocess), mid-approval; history stays valid."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent.llm import LLMClient
from agent.loop import CANCELLED_TOOL_RESULT, RunCancelled, run_loop
from agent.tools.registry import Tool, ToolContext, ToolOutput, ToolRegistry, ToolSettings
from agent.types import AgentEvent, Message, RunResult
from tests.fakes.openai_server import Call, FakeOpenAI, Reply


class SleepProcessTool(Tool):
    """Starts ``sleep 60`` in its own process group and kills the group when cancelled."""

    name = "sleep"
    description = "Sleep for a minute."
    parameters = {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.started = asyncio.Event()
        self.killed = False

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        proc = await asyncio.create_subprocess_exec("sleep", "60", start_new_session=True)
        self.pids.append(proc.pid)
        self.started.set()
        try:
            await proc.wait()
        except asyncio.CancelledError:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            self.killed = True
            raise
        return ToolOutput("slept")


class QuickTool(Tool):
    name = "quick"
    description = "Answers at once."
    parameters = {"type": "object", "properties": {}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput("quick result")


class AdminTool(Tool):
    name = "admin"
    description = "Needs approval."
    category = "admin"
    parameters = {"type": "object", "properties": {}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput("should not run")


@pytest.fixture
async def model(fake: FakeOpenAI) -> AsyncIterator[LLMClient]:
    client = LLMClient(model="gpt-test", base_url=fake.base_url, api_key="sk-test-key-000000", max_retries=0)
    yield client
    await client.aclose()


PROMPT = [Message.system("You are a bot."), Message.user("Do the thing.")]


class Harness:
    """Runs run_loop in a task the way the gateway does: catching RunCancelled in the same task."""

    def __init__(self, model: LLMClient, tools: list[Tool], tmp_path: Path, **kw: Any) -> None:
        self.events: list[AgentEvent] = []
        self.saved: list[RunResult] = []
        self.waiters: list[tuple[Callable[[AgentEvent], bool], asyncio.Event]] = []
        ctx = ToolContext(run_id="r", session_key="s", settings=ToolSettings(workspace=tmp_path))

        async def body() -> RunResult:
            try:
                return await run_loop(
                    list(PROMPT), model=model, tools=ToolRegistry(tools), ctx=ctx, run_id="r",
                    on_event=self.on_event, **kw,
                )
            except RunCancelled as exc:
                self.saved.append(exc.result)
                raise

        self.task = asyncio.create_task(body())

    async def on_event(self, event: AgentEvent) -> None:
        self.events.append(event)
        for predicate, flag in self.waiters:
            if predicate(event):
                flag.set()

    async def until(self, predicate: Callable[[AgentEvent], bool]) -> None:
        flag = asyncio.Event()
        if any(predicate(e) for e in self.events):
            return
        self.waiters.append((predicate, flag))
        await asyncio.wait_for(flag.wait(), 5)

    async def cancel(self) -> RunResult:
        """Cancel and return the saved result; fails if the run does not stop within 5 s."""
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 5)
        assert len(self.saved) == 1
        return self.saved[0]


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_cancel_mid_stream_keeps_partial_text_and_closes_the_stream(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path
) -> None:
    # 400 one-char chunks 50 ms apart: a run left alone would take 20 s.
    fake.script(Reply.text("z" * 400, reasoning="hm", chunk_chars=1, chunk_delay_s=0.05))
    harness = Harness(model, [], tmp_path)
    await harness.until(lambda e: e.type == "chunk")
    result = await harness.cancel()
    assert result.status == "cancelled"
    assert len(result.messages) == 1
    partial = result.messages[0]
    assert partial.role == "assistant" and partial.tool_calls is None
    assert partial.content and set(partial.content) == {"z"} and len(partial.content) < 400
    assert partial.reasoning == "hm"
    assert result.text == partial.content
    assert harness.events[-1].type == "run.cancelled"
    await fake.disconnects.wait(1)


async def test_cancel_before_the_first_byte(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    fake.script(Reply.text("late", first_byte_delay_s=30))
    harness = Harness(model, [], tmp_path)
    await fake.wait_for_requests(1)
    result = await harness.cancel()
    assert result.status == "cancelled"
    assert result.messages == []
    await fake.disconnects.wait(1)


async def test_cancel_mid_tool_kills_the_process_and_leaves_valid_history(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path
) -> None:
    sleeper = SleepProcessTool()
    fake.script(Reply.tool_calls([Call("quick", {}, id="q"), Call("sleep", {}, id="s")]))
    harness = Harness(model, [QuickTool(), sleeper], tmp_path)
    await harness.until(lambda e: e.type == "tool.result" and e.tool_call is not None and e.tool_call.id == "q")
    await asyncio.wait_for(sleeper.started.wait(), 5)
    pid = sleeper.pids[0]
    assert process_exists(pid)

    result = await harness.cancel()
    assert sleeper.killed
    assert not process_exists(pid)
    assert result.status == "cancelled"
    assert [m.role for m in result.messages] == ["assistant", "tool", "tool"]
    assert [c.id for c in result.messages[0].tool_calls or []] == ["q", "s"]
    assert (result.messages[1].tool_call_id, result.messages[1].content, result.messages[1].is_error) == (
        "q", "quick result", False,
    )
    assert (result.messages[2].tool_call_id, result.messages[2].content, result.messages[2].is_error) == (
        "s", CANCELLED_TOOL_RESULT, True,
    )
    cancelled_events = [e for e in harness.events if e.type == "tool.result" and e.error == CANCELLED_TOOL_RESULT]
    assert [e.tool_call.id for e in cancelled_events if e.tool_call] == ["s"]
    assert harness.events[-1].type == "run.cancelled"
    assert len(fake.requests) == 1  # no model call after the cancel


async def test_cancel_while_waiting_for_approval(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    asked = asyncio.Event()

    async def approve(name: str, args: dict[str, Any]) -> bool:
        asked.set()
        await asyncio.sleep(3600)
        return True

    fake.script(Reply.tool_calls([Call("admin", {}, id="a")]))
    harness = Harness(model, [AdminTool()], tmp_path, approve=approve)
    await asyncio.wait_for(asked.wait(), 5)
    result = await harness.cancel()
    assert [(m.role, m.content) for m in result.messages[1:]] == [("tool", CANCELLED_TOOL_RESULT)]
    assert result.messages[1].is_error


async def test_cancel_while_steering(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    entered = asyncio.Event()

    async def steer() -> list[Message]:
        if fake.requests:  # the second call: block
            entered.set()
            await asyncio.sleep(3600)
        return []

    fake.script(Reply.tool_calls([Call("quick", {}, id="q")]))
    harness = Harness(model, [QuickTool()], tmp_path, steer=steer)
    await asyncio.wait_for(entered.wait(), 5)
    result = await harness.cancel()
    assert [m.role for m in result.messages] == ["assistant", "tool"]
    assert result.messages[1].content == "quick result"


async def test_run_cancelled_reaches_a_plain_awaiter(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    fake.script(Reply.text("x", first_byte_delay_s=30))
    ctx = ToolContext(run_id="r", session_key="s", settings=ToolSettings(workspace=tmp_path))
    run: Awaitable[RunResult] = run_loop(list(PROMPT), model=model, tools=ToolRegistry(), ctx=ctx, run_id="r")
    task = asyncio.ensure_future(run)
    await fake.wait_for_requests(1)
    task.cancel()
    with pytest.raises(RunCancelled) as info:
        await task
    assert info.value.result.status == "cancelled"
    assert task.cancelled()
