"""The agent loop over cut, empty, stopped-early and odd model answers (real LLMClient, fake server).

What must hold: a cut answer's text is never stored and its tool calls never run; no
answer ends in a notice, not silence; ``length`` and ``content_filter`` answers are
shown with their notice and recorded in the run's events.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent import notices
from agent.llm import LLMClient
from agent.loop import run_loop
from agent.tools.registry import Tool, ToolContext, ToolOutput, ToolRegistry, ToolSettings
from agent.types import AgentEvent, Message, RunResult, ToolPolicy
from tests.fakes.openai_server import Call, FakeOpenAI, Reply

PROMPT = [Message.system("You are a helpful bot."), Message.user("Save a note.")]


class NoteTool(Tool):
    """Records every execution, so a test can tell that a call never ran."""

    name = "write_note"
    description = "Write a note."
    category = "write"
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    def __init__(self) -> None:
        self.written: list[str] = []

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        self.written.append(args["text"])
        return ToolOutput("saved")


async def run(model: LLMClient, tmp_path: Path, tool: NoteTool, events: list[AgentEvent]) -> RunResult:
    ctx = ToolContext(
        run_id="r1", session_key="agent:main:test:dm:1", settings=ToolSettings(workspace=tmp_path),
        policy=ToolPolicy(),
    )
    return await run_loop(
        list(PROMPT), model=model, tools=ToolRegistry([tool]), ctx=ctx, run_id="r1", on_event=events.append
    )


def note(text: str, call_id: str = "n1") -> Call:
    return Call("write_note", {"text": text}, id=call_id)


async def test_a_tool_call_from_a_cut_stream_never_runs(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    cut = Reply.tool_calls([note("pwned")], args_as="whole", omit_finish_reason=True)
    fake.script(cut, cut)  # the retry is cut too
    tool, events = NoteTool(), []
    result = await run(model, tmp_path, tool, events)
    assert tool.written == []
    assert result.status == "failed" and result.messages == []
    assert result.error is not None and result.error.startswith(notices.FAILURE_PREFIX)
    assert "finish_reason" not in result.error  # the operator's words stay out of the chat
    assert [e.type for e in events] == ["run.started", "run.failed"]


async def test_cut_text_is_streamed_but_never_stored(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    fake.script(Reply.truncated(4, text="Hello! This answer is cut"))
    tool, events = NoteTool(), []
    result = await run(model, tmp_path, tool, events)
    assert "".join(e.text for e in events if e.type == "chunk") == "Hello! This "
    assert result.status == "failed" and result.messages == [] and result.text == ""
    assert result.error is not None and "midway" in result.error
    assert len(fake.requests) == 1


async def test_a_cut_after_a_finished_tool_step_keeps_the_step(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path
) -> None:
    fake.script(Reply.tool_calls([note("first")]), Reply.truncated(3, text="Saved it, and th"))
    tool, events = NoteTool(), []
    result = await run(model, tmp_path, tool, events)
    assert tool.written == ["first"]
    assert result.status == "failed"
    assert [(m.role, m.content) for m in result.messages] == [("assistant", None), ("tool", "saved")]


async def test_no_answer_twice_ends_in_a_notice_not_silence(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    fake.script(Reply.text(""), Reply.text("", reasoning="only thoughts"))
    events: list[AgentEvent] = []
    result = await run(model, tmp_path, NoteTool(), events)
    assert result.status == "failed" and result.messages == []
    assert result.error is not None and "answered with nothing" in result.error
    assert len(fake.requests) == 2


async def test_length_delivers_the_text_with_a_notice_and_stores_only_the_text(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path
) -> None:
    fake.script(Reply.text("Part one of the story", finish_reason="length"))
    events: list[AgentEvent] = []
    result = await run(model, tmp_path, NoteTool(), events)
    assert result.status == "completed"
    assert result.text == f"Part one of the story\n\n{notices.LENGTH}"
    assert [(m.role, m.content) for m in result.messages] == [("assistant", "Part one of the story")]
    [done] = [e for e in events if e.type == "run.completed"]
    assert done.data["finish_reason"] == "length"


async def test_length_with_tool_calls_does_not_run_them(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    fake.script(Reply.tool_calls([Call("write_note", '{"text": "half a no', id="x")], text="Let me save",
                                 finish_reason="length"))
    tool, events = NoteTool(), []
    result = await run(model, tmp_path, tool, events)
    assert tool.written == []
    assert [(m.role, m.content, m.tool_calls) for m in result.messages] == [("assistant", "Let me save", None)]
    assert result.text.endswith(notices.LENGTH)


async def test_content_filter_with_nothing_shown_is_the_notice_alone(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path
) -> None:
    fake.script(Reply.text("", finish_reason="content_filter"))
    events: list[AgentEvent] = []
    result = await run(model, tmp_path, NoteTool(), events)
    assert (result.status, result.text, result.messages) == ("completed", notices.CONTENT_FILTER, [])
    [done] = [e for e in events if e.type == "run.completed"]
    assert done.data["finish_reason"] == "content_filter"


@pytest.mark.parametrize("args_as", ["whole", "object"])
async def test_arguments_as_object_or_whole_run_the_tool(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path, args_as: str
) -> None:
    fake.script(Reply.tool_calls([note("hello")], args_as=args_as, omit_tool_index=True), Reply.text("Saved."))
    tool, events = NoteTool(), []
    result = await run(model, tmp_path, tool, events)
    assert tool.written == ["hello"]
    assert result.text == "Saved."
    assert json.loads(result.messages[0].tool_calls[0].arguments) == {"text": "hello"}  # type: ignore[index]
