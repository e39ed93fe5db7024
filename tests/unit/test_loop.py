"""The agent loop with the real LLMClient against the fake OpenAI server and small in-test tools."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agent import notices
from agent.llm import LLMClient, LLMError
from agent.loop import MAX_ITERATIONS_TEXT, SUMMARY_PROMPT, run_loop
from agent.tools.registry import Tool, ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSettings
from agent.types import AgentEvent, Message, RunResult, ToolCall, ToolPolicy
from tests.fakes.openai_server import Call, FakeOpenAI, Reply


class AddTool(Tool):
    name = "add"
    description = "Add two integers."
    parameters = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput(str(args["a"] + args["b"]))


class CrashTool(Tool):
    name = "crash"
    description = "Always raises."
    parameters = {"type": "object", "properties": {}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raise RuntimeError("boom happened\nsecond line with details")


class RefuseTool(Tool):
    name = "refuse"
    description = "Fails the expected way."
    parameters = {"type": "object", "properties": {}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raise ToolError("Error: nothing to refuse")


class WriteTool(Tool):
    name = "write"
    description = "A write-category tool."
    category = "write"
    parameters = {"type": "object", "properties": {}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput("written")


class AdminTool(Tool):
    name = "admin"
    description = "An admin-category tool."
    category = "admin"
    parameters = {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.runs = 0

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        self.runs += 1
        return ToolOutput("admin done")


class RendezvousTool(Tool):
    """Every call waits until all ``expected`` calls have started; ends in reverse call order.

    Run one after another, the first call would wait for the others forever (and time out),
    so a clean result for every call shows they ran concurrently.
    """

    name = "meet"
    description = "Meet the others."
    parameters = {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]}

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.log: list[tuple[str, int]] = []
        self.all_started = asyncio.Event()
        self.ended = [asyncio.Event() for _ in range(expected)]

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        i = args["i"]
        self.log.append(("start", i))
        if sum(1 for kind, _ in self.log if kind == "start") == self.expected:
            self.all_started.set()
        try:
            await asyncio.wait_for(self.all_started.wait(), 5)
            if i + 1 < self.expected:
                await asyncio.wait_for(self.ended[i + 1].wait(), 5)
        except TimeoutError as exc:
            raise ToolError(f"Error: call {i} waited alone") from exc
        self.log.append(("end", i))
        self.ended[i].set()
        return ToolOutput(f"met {i}")


def make_ctx(tmp_path: Path, policy: ToolPolicy | None = None) -> ToolContext:
    return ToolContext(
        run_id="run1", session_key="agent:main:test:dm:1", settings=ToolSettings(workspace=tmp_path),
        policy=policy or ToolPolicy(),
    )


class Recorder:
    def __init__(self) -> None:
        self.events: list[AgentEvent] = []

    async def __call__(self, event: AgentEvent) -> None:
        self.events.append(event)

    def types(self) -> list[str]:
        return [e.type for e in self.events]

    def of(self, kind: str) -> list[AgentEvent]:
        return [e for e in self.events if e.type == kind]


PROMPT = [Message.system("You are a helpful bot."), Message.user("What is 1 + 2?")]


def assert_valid_history(messages: list[Message]) -> None:
    """Every assistant tool call is answered by exactly one tool result, right after it."""
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.role == "assistant" and m.tool_calls:
            ids = [c.id for c in m.tool_calls]
            results = [r.tool_call_id for r in messages[i + 1 : i + 1 + len(ids)]]
            assert results == ids, f"tool calls {ids} answered by {results}"
            assert all(r.role == "tool" for r in messages[i + 1 : i + 1 + len(ids)])
            i += 1 + len(ids)
        else:
            assert m.role != "tool", f"orphan tool result at {i}"
            i += 1


async def run(model: LLMClient, tmp_path: Path, tools: list[Tool], **kw: Any) -> RunResult:
    kw.setdefault("ctx", make_ctx(tmp_path))
    return await run_loop(list(kw.pop("messages", PROMPT)), model=model, tools=ToolRegistry(tools), run_id="run1", **kw)


async def test_text_only_reply_in_one_iteration(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    fake.script(Reply.text("It is 3.", chunk_chars=2))
    events = Recorder()
    prompt = list(PROMPT)
    result = await run(model, tmp_path, [AddTool()], messages=prompt, on_event=events)
    assert result.status == "completed"
    assert result.text == "It is 3."
    assert result.iterations == 1
    assert [(m.role, m.content) for m in result.messages] == [("assistant", "It is 3.")]
    assert prompt == PROMPT  # the caller's list is not modified
    assert events.types()[0] == "run.started" and events.types()[-1] == "run.completed"
    assert "".join(e.text for e in events.of("chunk")) == "It is 3."
    assert events.of("run.completed")[0].text == "It is 3."
    assert fake.requests[0]["tools"][0]["function"]["name"] == "add"


async def test_one_tool_then_final_answer(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    fake.script(Reply.tool_calls([Call("add", {"a": 1, "b": 2}, id="c1")]), Reply.text("The answer is 3."))
    events = Recorder()
    result = await run(model, tmp_path, [AddTool()], on_event=events)
    assert result.status == "completed"
    assert result.text == "The answer is 3."
    assert result.iterations == 2
    assert [m.role for m in result.messages] == ["assistant", "tool", "assistant"]
    assert result.messages[0].tool_calls == [ToolCall(id="c1", name="add", arguments='{"a": 1, "b": 2}')]
    assert (result.messages[1].tool_call_id, result.messages[1].content, result.messages[1].is_error) == ("c1", "3", False)
    # The second request carries the call and its result in OpenAI form.
    sent = fake.requests[1]["messages"]
    assert sent[-2]["tool_calls"][0]["id"] == "c1"
    assert sent[-1] == {"role": "tool", "content": "3", "tool_call_id": "c1"}
    assert events.types() == [
        "run.started", "tool.call", "tool.result", *["chunk"] * len(events.of("chunk")), "run.completed",
    ]
    assert events.of("tool.result")[0].duration_ms is not None


async def test_several_tools_run_concurrently_and_keep_call_order(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path
) -> None:
    meet = RendezvousTool(expected=3)
    fake.script(
        Reply.tool_calls([Call("meet", {"i": i}, id=f"m{i}") for i in range(3)]),
        Reply.text("all met"),
    )
    result = await run(model, tmp_path, [meet])
    assert result.status == "completed"
    tool_msgs = [m for m in result.messages if m.role == "tool"]
    assert [(m.tool_call_id, m.content, m.is_error) for m in tool_msgs] == [
        ("m0", "met 0", False), ("m1", "met 1", False), ("m2", "met 2", False),
    ]
    # Every call started before any ended (overlap), and they ended in reverse order.
    assert [kind for kind, _ in meet.log] == ["start"] * 3 + ["end"] * 3
    assert [i for kind, i in meet.log if kind == "end"] == [2, 1, 0]


async def test_tool_exception_becomes_an_error_result_and_the_model_answers(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path
) -> None:
    fake.script(Reply.tool_calls([Call("crash", {}, id="x")]), Reply.text("Sorry, the tool failed."))
    events = Recorder()
    result = await run(model, tmp_path, [CrashTool()], on_event=events)
    assert result.status == "completed"
    assert result.text == "Sorry, the tool failed."
    err = result.messages[1]
    assert err.is_error is True
    assert err.content == "Error: tool 'crash' failed: RuntimeError: boom happened"
    assert "Traceback" not in fake.requests[1]["messages"][-1]["content"]
    assert events.of("tool.result")[0].error == err.content


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (Call("nope", {}), "unknown tool 'nope'"),
        (Call("add", '{"a": 1, "b": '), "not valid JSON"),
        (Call("add", {"a": "one", "b": 2}), "invalid arguments for 'add'"),
        (Call("add", {"a": 1}), "'b' is a required property"),
        (Call("refuse", {}), "Error: nothing to refuse"),
    ],
    ids=["unknown-tool", "invalid-json", "schema-type", "schema-required", "tool-error"],
)
async def test_bad_calls_come_back_as_error_results(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path, call: Call, expected: str
) -> None:
    call.id = "bad"
    fake.script(Reply.tool_calls([call]), Reply.text("I see the problem."))
    result = await run(model, tmp_path, [AddTool(), RefuseTool()])
    assert result.status == "completed"
    tool_msg = result.messages[1]
    assert tool_msg.role == "tool" and tool_msg.tool_call_id == "bad" and tool_msg.is_error
    assert expected in (tool_msg.content or "")
    assert fake.requests[1]["messages"][-1]["content"] == tool_msg.content
    assert_valid_history(result.messages)


async def test_multi_step_tool_chain(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    def responder(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if last["role"] == "user":
            return Reply.tool_calls([Call("add", {"a": 1, "b": 2})])
        total = int(last["content"])
        if total < 10:
            return Reply.tool_calls([Call("add", {"a": total, "b": total})])
        return Reply.text(f"Final: {total}")

    fake.responder = responder
    result = await run(model, tmp_path, [AddTool()])
    assert result.status == "completed"
    assert result.text == "Final: 12"
    assert [m.content for m in result.messages if m.role == "tool"] == ["3", "6", "12"]
    assert result.iterations == 4
    assert len(fake.requests) == 4
    assert_valid_history(result.messages)


async def test_max_iterations_asks_for_a_summary_without_tools(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path
) -> None:
    fake.script(
        Reply.tool_calls([Call("add", {"a": 1, "b": 1})]),
        Reply.tool_calls([Call("add", {"a": 2, "b": 2})]),
        Reply.text("Summary: I added twice."),
    )
    result = await run(model, tmp_path, [AddTool()], max_iterations=2)
    assert result.status == "max_iterations"
    assert result.text == "Summary: I added twice."
    assert len(fake.requests) == 3
    assert "tools" in fake.requests[0] and "tools" in fake.requests[1]
    assert "tools" not in fake.requests[2]
    assert fake.requests[2]["messages"][-1] == {"role": "user", "content": SUMMARY_PROMPT}
    # The summary prompt is not part of the session; the summary answer is.
    assert [m.role for m in result.messages] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert result.messages[-1].content == "Summary: I added twice."
    assert_valid_history(result.messages)


async def test_max_iterations_falls_back_when_the_summary_fails(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path
) -> None:
    fake.script(Reply.tool_calls([Call("add", {"a": 1, "b": 1})]), Reply.error(400, message="no"))
    events = Recorder()
    result = await run(model, tmp_path, [AddTool()], max_iterations=1, on_event=events)
    assert result.status == "max_iterations"
    assert result.text == MAX_ITERATIONS_TEXT
    assert result.messages[-1].content == MAX_ITERATIONS_TEXT
    assert "tools" not in fake.requests[1]
    assert events.of("run.completed")[0].data["status"] == "max_iterations"
    assert_valid_history(result.messages)


async def test_llm_failure_fails_the_run_with_valid_history(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path
) -> None:
    fake.script(Reply.tool_calls([Call("add", {"a": 1, "b": 1}, id="t")]), Reply.error(401))
    events = Recorder()
    result = await run(model, tmp_path, [AddTool()], on_event=events)
    assert result.status == "failed"
    # The chat user's words: what happened, no status code or config key.
    assert result.error == notices.failure_notice(LLMError("x", kind="auth", retryable=False, status=401))
    assert "401" not in result.error and "api_key" not in result.error
    assert [m.role for m in result.messages] == ["assistant", "tool"]
    assert_valid_history(result.messages)
    assert events.types()[-1] == "run.failed"
    assert events.of("run.failed")[0].error == result.error


async def test_steered_messages_are_added_before_the_next_call(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path
) -> None:
    inbox: list[list[Message]] = [[], [Message.user("Also add 5.")]]
    asked: list[int] = []

    async def steer() -> list[Message]:
        asked.append(len(fake.requests))
        return inbox.pop(0) if inbox else []

    fake.script(Reply.tool_calls([Call("add", {"a": 1, "b": 2}, id="c")]), Reply.text("3, and then 8."))
    result = await run(model, tmp_path, [AddTool()], steer=steer)
    assert asked == [0, 1]  # asked before each model call
    assert [(m.role, m.content) for m in result.messages[1:]] == [
        ("tool", "3"), ("user", "Also add 5."), ("assistant", "3, and then 8."),
    ]
    assert fake.requests[1]["messages"][-1] == {"role": "user", "content": "Also add 5."}


async def test_reasoning_is_streamed_as_events_and_kept_out_of_the_wire(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path
) -> None:
    fake.script(
        Reply.tool_calls([Call("add", {"a": 1, "b": 2})], reasoning="I should use add."),
        Reply.text("3", reasoning="The tool said 3."),
    )
    events = Recorder()
    result = await run(model, tmp_path, [AddTool()], on_event=events)
    assert "".join(e.text for e in events.of("reasoning")) == "I should use add.The tool said 3."
    assert result.messages[0].reasoning == "I should use add."
    assert result.messages[-1].reasoning == "The tool said 3."
    assert all("reasoning" not in json.dumps(m) for m in fake.requests[1]["messages"])


async def test_usage_is_summed_from_the_api(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    fake.script(
        Reply.tool_calls([Call("add", {"a": 1, "b": 2})], usage={"prompt_tokens": 100, "completion_tokens": 10}),
        Reply.text("3", usage={"prompt_tokens": 120, "completion_tokens": 5}),
    )
    result = await run(model, tmp_path, [AddTool()])
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.estimated) == (220, 15, False)


async def test_usage_is_estimated_when_the_api_gives_none(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    fake.script(Reply.text("abcdefgh", usage=False))
    result = await run(model, tmp_path, [], messages=[Message.user("x" * 40)])
    # prompt: 40 chars / 4 + 16 for one message; completion: 8 chars / 4.
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.estimated) == (26, 2, True)
    assert "tools" not in fake.requests[0]  # an empty registry offers no tools


async def test_tool_call_deltas_without_index(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    fake.script(
        Reply.tool_calls([Call("add", {"a": 1, "b": 2}), Call("add", {"a": 5, "b": 5})], omit_tool_index=True),
        Reply.text("3 and 10"),
    )
    result = await run(model, tmp_path, [AddTool()])
    assert [m.content for m in result.messages if m.role == "tool"] == ["3", "10"]
    assert_valid_history(result.messages)


async def test_a_failing_event_callback_does_not_end_the_run(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path
) -> None:
    seen: list[str] = []

    def callback(event: AgentEvent) -> None:  # a sync callback is accepted too
        seen.append(event.type)
        raise RuntimeError("callback bug")

    fake.script(Reply.tool_calls([Call("add", {"a": 1, "b": 2})]), Reply.text("3"))
    result = await run(model, tmp_path, [AddTool()], on_event=callback)
    assert result.status == "completed" and result.text == "3"
    assert seen[0] == "run.started" and seen[-1] == "run.completed" and "tool.result" in seen


async def test_a_failing_steer_callback_does_not_end_the_run(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path
) -> None:
    async def steer() -> list[Message]:
        raise ConnectionError("inbox unavailable")

    result = await run(model, tmp_path, [], steer=steer)
    assert result.status == "completed"
    assert result.text == PROMPT[-1].content  # the fake echoes the last user message


async def test_policy_denials_are_error_results(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    admin = AdminTool()
    fake.script(
        Reply.tool_calls([Call("admin", {}, id="a"), Call("write", {}, id="w")]),
        Reply.text("Denied."),
    )
    scheduled = make_ctx(tmp_path, ToolPolicy(context="scheduled"))
    result = await run(model, tmp_path, [admin, WriteTool()], ctx=scheduled)
    results = {m.tool_call_id: m for m in result.messages if m.role == "tool"}
    assert results["a"].is_error and "not allowed in a scheduled run" in (results["a"].content or "")
    assert results["w"].is_error and "not allowed in a scheduled run" in (results["w"].content or "")
    assert admin.runs == 0


async def test_admin_tools_need_approval(fake: FakeOpenAI, model: LLMClient, tmp_path: Path) -> None:
    admin = AdminTool()
    asked: list[tuple[str, dict[str, Any]]] = []

    async def approve(name: str, args: dict[str, Any]) -> bool:
        asked.append((name, args))
        return len(asked) == 1  # approve the first, deny the second

    fake.script(
        Reply.tool_calls([Call("admin", {}, id="a1")]),
        Reply.tool_calls([Call("admin", {}, id="a2")]),
        Reply.text("done"),
    )
    result = await run(model, tmp_path, [admin], approve=approve)
    results = {m.tool_call_id: m for m in result.messages if m.role == "tool"}
    assert (results["a1"].content, results["a1"].is_error) == ("admin done", False)
    assert results["a2"].is_error and "denied" in (results["a2"].content or "")
    assert admin.runs == 1 and len(asked) == 2

    fake.script(Reply.tool_calls([Call("admin", {}, id="a3")]), Reply.text("no approver"))
    result = await run(model, tmp_path, [admin])
    assert result.messages[1].is_error and "no approver" in (result.messages[1].content or "")
    assert admin.runs == 1


async def test_max_iterations_must_be_positive(model: LLMClient, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_iterations"):
        await run(model, tmp_path, [], max_iterations=0)


class BrokenModel:
    """A ChatModel with a bug: raises something that is not an LLMError."""

    async def complete(self, messages: Sequence[Message], tools: Any, on_delta: Any = None) -> Any:
        raise KeyError("choices")

    async def aclose(self) -> None:
        """Holds nothing."""


class NoOutputTool(Tool):
    name = "nothing"
    description = "Returns the wrong type."
    parameters = {"type": "object", "properties": {}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return "a plain string"  # type: ignore[return-value]


async def test_a_model_bug_fails_the_run_cleanly(tmp_path: Path) -> None:
    events = Recorder()
    result = await run_loop(
        list(PROMPT), model=BrokenModel(), tools=ToolRegistry(), ctx=make_ctx(tmp_path), run_id="r", on_event=events
    )
    assert result.status == "failed"
    assert result.error == notices.INTERNAL_ERROR
    assert result.messages == []
    assert events.types() == ["run.started", "run.failed"]


async def test_a_tool_with_unusable_output_is_an_error_result(
    fake: FakeOpenAI, model: LLMClient, tmp_path: Path
) -> None:
    fake.script(Reply.tool_calls([Call("nothing", {}, id="n")]), Reply.text("ok"))
    result = await run(model, tmp_path, [NoOutputTool()])
    assert result.messages[1].is_error
    assert result.messages[1].content == "Error: tool 'nothing' returned no usable output."
