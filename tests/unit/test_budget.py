"""The context budget: thresholds, the request estimate, the compaction target, the pre-flight."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agent import notices
from agent.budget import (
    Baseline,
    ContextBudget,
    ContextFull,
    Preflight,
    estimate_request,
    keep_for_target,
    tools_tokens,
)
from agent.llm_types import DeltaCallback, LLMResponse
from agent.loop import run_loop
from agent.tokens import estimate_tokens
from agent.tools.registry import Tool, ToolContext, ToolOutput, ToolRegistry, ToolSettings
from agent.types import Message, ToolCall, Usage


def text_of_tokens(tokens: int) -> str:
    """Content the estimate counts as ``tokens`` tokens once the 16 per message are added."""
    return "x" * ((tokens - 16) * 4)


# -- thresholds ------------------------------------------------------------------------


def test_thresholds_are_95_82_and_80_percent_of_the_window() -> None:
    budget = ContextBudget(100_000)
    assert (budget.limit, budget.target, budget.warn_at) == (95_000, 82_000, 80_000)
    assert budget.fits(95_000) and not budget.fits(95_001)
    assert budget.should_warn(80_000) and not budget.should_warn(79_999)
    assert budget.fill(120_000) == 1.2


def test_a_window_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError):
        ContextBudget(0)


# -- the estimate ----------------------------------------------------------------------


def test_without_a_baseline_the_whole_request_is_estimated_tools_included() -> None:
    messages = [Message.system("s" * 400), Message.user("u" * 40)]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    assert tools_tokens(tools) > 0
    assert estimate_request(messages, tools=tools) == 100 + 16 + 10 + 16 + tools_tokens(tools)


def test_tool_schemas_count_as_the_characters_of_their_json_as_sent() -> None:
    tools = [{"type": "function", "function": {"name": "wetter", "description": "Grüße — ☀", "parameters": {}}}]
    sent = '[{"type":"function","function":{"name":"wetter","description":"Grüße — ☀","parameters":{}}}]'
    assert tools_tokens(tools) == -(-len(sent) // 4)
    # An integer orjson refuses (past 64 bits) is still counted, not an error.
    huge = [{"type": "function", "function": {"name": "n", "parameters": {"maximum": 2**70}}}]
    assert tools_tokens(huge) > 0


def test_the_last_calls_usage_plus_what_was_added_since() -> None:
    sent = [Message.system("s"), Message.user("hi")]
    added = [Message.assistant("a" * 400), Message.user("u" * 40)]
    # The provider counted 5000 tokens for the first two (a tokenizer the estimate cannot know).
    tokens = estimate_request([*sent, *added], baseline=Baseline(5000, covers=2))
    assert tokens == 5000 + (100 + 16) + (10 + 16)


def test_the_estimate_never_falls_below_the_whole_requests_estimate() -> None:
    # A stale baseline (the history grew without a usage figure) must not hide the growth.
    messages = [Message.system("s"), Message.user("x" * 40_000), Message.user("now")]
    assert estimate_request(messages, baseline=Baseline(50, covers=2)) == estimate_tokens(messages)


def test_a_baseline_covering_more_than_the_request_is_ignored() -> None:
    messages = [Message.user("a" * 40)]
    assert estimate_request(messages, baseline=Baseline(10_000, covers=5)) == estimate_tokens(messages)


def test_tool_call_arguments_count() -> None:
    call = ToolCall(id="c1", name="write_file", arguments='{"content": "' + "z" * 4000 + '"}')
    assert estimate_request([Message.assistant(None, [call])]) > 1000


# -- the compaction target -------------------------------------------------------------


def test_keep_for_target_keeps_the_recent_messages_that_fit() -> None:
    messages = [Message.user(text_of_tokens(100)) for _ in range(10)]
    assert keep_for_target(messages, 350) == 3
    assert keep_for_target(messages, 99) == 0
    assert keep_for_target(messages, 10_000) == 10
    assert keep_for_target(messages, 10_000, max_keep=9) == 9
    assert keep_for_target(messages, -5) == 0


def test_keep_for_target_never_starts_with_a_tool_result() -> None:
    call = ToolCall(id="c1", name="read_file", arguments="{}")
    messages = [
        Message.user(text_of_tokens(100)),
        Message.assistant(None, [call]),
        Message.tool("c1", text_of_tokens(100)),
        Message.assistant(text_of_tokens(100)),
    ]
    # Two fit (the result and the answer), but the result's call would be summarized away.
    assert keep_for_target(messages, 210) == 1


# -- the pre-flight ----------------------------------------------------------------------


async def test_a_request_that_fits_is_sent_as_it_is() -> None:
    history = [Message.system("s"), Message.user("hello")]
    preflight = Preflight(ContextBudget(10_000))
    assert await preflight.fit(history, 0, None) is history
    assert preflight.compactions == 0


async def test_over_95_percent_compacts_with_the_allowance_for_82_percent() -> None:
    asked: list[int] = []
    own = Message.assistant(text_of_tokens(200))

    async def compact(allowance: int) -> list[Message]:
        asked.append(allowance)
        return [Message.system("s"), Message.user("summary")]

    history = [Message.system("s"), Message.user(text_of_tokens(9_500)), Message.user("now"), own]
    preflight = Preflight(ContextBudget(10_000), compact=compact)
    fitted = await preflight.fit(history, 1, None)
    assert asked == [8_200 - 200]  # the target minus the run's own messages
    assert fitted == [Message.system("s"), Message.user("summary"), own]
    assert preflight.compactions == 1 and preflight.baseline is None


async def test_a_baseline_over_the_limit_triggers_compaction_although_the_text_is_short() -> None:
    calls: list[int] = []

    async def compact(allowance: int) -> list[Message]:
        calls.append(allowance)
        return [Message.user("short")]

    preflight = Preflight(ContextBudget(10_000), compact=compact)
    preflight.measured(9_900, 2, estimated=False)
    await preflight.fit([Message.system("s"), Message.user("hi"), Message.user("more")], 0, None)
    assert len(calls) == 1


async def test_an_estimated_usage_is_no_baseline() -> None:
    preflight = Preflight(ContextBudget(10_000))
    preflight.measured(9_900, 2, estimated=True)
    assert preflight.baseline is None


async def test_when_compaction_cannot_help_the_run_ends_with_context_full() -> None:
    async def compact(allowance: int) -> None:
        return None

    history = [Message.system("s"), Message.user(text_of_tokens(20_000))]
    with pytest.raises(ContextFull) as caught:
        await Preflight(ContextBudget(10_000), compact=compact).fit(history, 0, None)
    assert caught.value.window == 10_000 and caught.value.tokens > 10_000


async def test_a_crashing_hook_ends_as_context_full_not_as_the_crash() -> None:
    async def compact(allowance: int) -> list[Message]:
        raise RuntimeError("boom")

    with pytest.raises(ContextFull):
        await Preflight(ContextBudget(10_000), compact=compact).fit([Message.user(text_of_tokens(20_000))], 0, None)


async def test_pruning_old_tool_results_comes_before_compaction() -> None:
    async def compact(allowance: int) -> list[Message]:
        raise AssertionError("pruning was enough")

    big = "r" * 36_000
    history: list[Message] = [Message.system("s"), Message.user("start")]
    for i in range(4):
        call = ToolCall(id=f"c{i}", name="read_file", arguments="{}")
        history += [Message.assistant(None, [call]), Message.tool(f"c{i}", big), Message.assistant("ok")]
    preflight = Preflight(ContextBudget(40_000), compact=compact)
    fitted = await preflight.fit(history, 0, None)
    assert len(fitted) == len(history) and preflight.budget.fits(estimate_request(fitted))
    assert history[3].content == big  # the caller's list is not changed


# -- in the loop ---------------------------------------------------------------------------


class BigTool(Tool):
    name = "big"
    description = "Returns a lot of text."
    parameters = {"type": "object", "properties": {}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput(text_of_tokens(3_000))


class ScriptedModel:
    """A ChatModel that answers from a list and records what it was sent."""

    def __init__(self, *responses: LLMResponse) -> None:
        self.responses = list(responses)
        self.sent: list[list[Message]] = []

    async def complete(
        self, messages: Sequence[Message], tools: list[dict[str, Any]] | None, on_delta: DeltaCallback | None = None
    ) -> LLMResponse:
        self.sent.append(list(messages))
        return self.responses.pop(0)


def loop_ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(run_id="r1", session_key="agent:main:test:dm:1", settings=ToolSettings(workspace=tmp_path))


def calls_big() -> LLMResponse:
    return LLMResponse(
        tool_calls=[ToolCall(id="c1", name="big", arguments="{}")], finish_reason="tool_calls",
        usage=Usage(prompt_tokens=500, completion_tokens=10),
    )


async def test_the_loop_compacts_before_the_call_that_would_overflow(tmp_path: Path) -> None:
    model = ScriptedModel(calls_big(), LLMResponse(text="done", finish_reason="stop"))
    start = [Message.system("s"), Message.user(text_of_tokens(1_000)), Message.user("go")]
    summary = [Message.system("s"), Message.user("summary"), Message.user("go")]
    asked: list[int] = []

    async def compact(allowance: int) -> list[Message]:
        asked.append(allowance)
        return summary

    result = await run_loop(
        start, model=model, tools=ToolRegistry([BigTool()]), ctx=loop_ctx(tmp_path), run_id="r1",
        preflight=Preflight(ContextBudget(4_096), compact=compact),
    )
    assert result.status == "completed" and result.text == "done"
    assert model.sent[0] == start and len(asked) == 1
    assert model.sent[1][:3] == summary  # the compacted start, then the run's own messages
    assert model.sent[1][3:] == result.messages[:2]
    assert [m.role for m in result.messages] == ["assistant", "tool", "assistant"]


async def test_the_loop_ends_with_the_context_notice_and_a_valid_history(tmp_path: Path) -> None:
    model = ScriptedModel(calls_big())
    result = await run_loop(
        [Message.system("s"), Message.user("go")], model=model, tools=ToolRegistry([BigTool()]),
        ctx=loop_ctx(tmp_path), run_id="r1", preflight=Preflight(ContextBudget(2_048)),
    )
    assert result.status == "failed" and result.error == notices.CONTEXT_FULL
    assert len(model.sent) == 1  # the second, oversized request was never made
    assert [m.role for m in result.messages] == ["assistant", "tool"]
