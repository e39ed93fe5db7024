"""StreamAssembler: provider quirks of streamed chat completions, fed as raw chunk dicts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent.llm_stream import StreamAssembler, decode_json, encode_json
from agent.llm_types import StreamDelta, estimate_text_tokens, estimate_tokens
from agent.types import Message, ToolCall


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def call_delta(index: int | None = None, id: str | None = None, name: str | None = None, args: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"function": {}}
    if index is not None:
        out["index"] = index
    if id is not None:
        out["id"] = id
        out["type"] = "function"
    if name is not None:
        out["function"]["name"] = name
    if args is not None:
        out["function"]["arguments"] = args
    return out


def feed_all(chunks: list[dict[str, Any]]) -> tuple[StreamAssembler, list[StreamDelta]]:
    assembler = StreamAssembler()
    deltas: list[StreamDelta] = []
    for c in chunks:
        deltas.extend(assembler.feed(c))
    return assembler, deltas


def test_indexed_calls_interleaved() -> None:
    assembler, _ = feed_all(
        [
            chunk({"tool_calls": [call_delta(0, "a", "read", ""), call_delta(1, "b", "write", "")]}),
            chunk({"tool_calls": [call_delta(1, args='{"x"'), call_delta(0, args='{"p"')]}),
            chunk({"tool_calls": [call_delta(0, args=": 1}"), call_delta(1, args=": 2}")]}, "tool_calls"),
        ]
    )
    assert assembler.tool_calls() == [
        ToolCall(id="a", name="read", arguments='{"p": 1}'),
        ToolCall(id="b", name="write", arguments='{"x": 2}'),
    ]
    assert assembler.finish_reason == "tool_calls"


def test_missing_index_continues_the_last_call_unless_a_new_id_arrives() -> None:
    assembler, _ = feed_all(
        [
            chunk({"tool_calls": [call_delta(None, "a", "one", "{")]}),
            chunk({"tool_calls": [call_delta(None, args="}")]}),
            chunk({"tool_calls": [call_delta(None, "b", "two", "")]}),
            chunk({"tool_calls": [call_delta(None, args='{"k": ')]}),
            chunk({"tool_calls": [call_delta(None, args="3}")]}),
        ]
    )
    assert assembler.tool_calls() == [
        ToolCall(id="a", name="one", arguments="{}"),
        ToolCall(id="b", name="two", arguments='{"k": 3}'),
    ]


def test_an_index_reused_with_a_new_id_starts_a_new_call() -> None:
    assembler, _ = feed_all(
        [
            chunk({"tool_calls": [call_delta(0, "a", "one", "{}")]}),
            chunk({"tool_calls": [call_delta(0, "b", "two", '{"z": 1}')]}),
        ]
    )
    assert [(c.id, c.name, c.arguments) for c in assembler.tool_calls()] == [("a", "one", "{}"), ("b", "two", '{"z": 1}')]


def test_a_call_without_id_gets_one_and_empty_fragments_are_dropped() -> None:
    assembler, _ = feed_all(
        [
            chunk({"tool_calls": [call_delta(0, None, "solo", '{"a": 1}')]}),
            chunk({"tool_calls": [call_delta(1)]}),
        ]
    )
    calls = assembler.tool_calls()
    assert len(calls) == 1
    assert calls[0].name == "solo" and calls[0].id.startswith("call_")
    assert assembler.tool_calls()[0].id != "" and len(calls[0].id) > 5


def test_repeated_name_in_continuation_deltas_is_not_duplicated() -> None:
    assembler, _ = feed_all(
        [
            chunk({"tool_calls": [call_delta(0, "a", "search", '{"q"')]}),
            chunk({"tool_calls": [call_delta(0, None, "search", ': "x"}')]}),
        ]
    )
    assert assembler.tool_calls() == [ToolCall(id="a", name="search", arguments='{"q": "x"}')]


def test_reasoning_takes_the_first_named_field_only() -> None:
    assembler, deltas = feed_all(
        [
            chunk({"reasoning": "think ", "reasoning_content": "think "}),
            chunk({"thinking": "more"}),
            chunk({"content": "answer"}),
        ]
    )
    assert assembler.reasoning == "think more"
    assert deltas == [StreamDelta("reasoning", "think "), StreamDelta("reasoning", "more"), StreamDelta("text", "answer")]


def test_refusal_is_visible_text_and_other_choices_are_ignored() -> None:
    assembler, deltas = feed_all(
        [
            {"choices": [{"index": 1, "delta": {"content": "other choice"}}]},
            chunk({"refusal": "I can't help with that."}, "stop"),
        ]
    )
    assert assembler.text == "I can't help with that."
    assert deltas == [StreamDelta("text", "I can't help with that.")]


def test_usage_on_the_last_choice_chunk_is_used() -> None:
    assembler, _ = feed_all([chunk({"content": "hi"}, "stop", usage={"prompt_tokens": 9, "completion_tokens": 1})])
    usage = assembler.usage([Message.user("x")])
    assert (usage.prompt_tokens, usage.completion_tokens, usage.estimated) == (9, 1, False)


def test_estimate_counts_contents_and_tool_calls() -> None:
    messages = [
        Message.system("12345678"),  # 8
        Message.assistant(None, [ToolCall(id="c", name="abcd", arguments='{"a":1}')]),  # 4 + 7
        Message.tool("c", "xyz"),  # 3
    ]
    assert estimate_tokens(messages) == 6 + 3 * 16  # ceil(22 / 4) = 6
    assert estimate_tokens([]) == 0
    assert estimate_text_tokens("") == 0
    assert estimate_text_tokens("abcde") == 2


def test_estimated_usage_when_the_stream_has_none() -> None:
    assembler, _ = feed_all([chunk({"content": "abcd"}), chunk({"tool_calls": [call_delta(0, "i", "nm", "{}")]})])
    usage = assembler.usage([Message.user("hello world!")])
    assert usage.estimated is True
    assert usage.prompt_tokens == 3 + 16
    assert usage.completion_tokens == 2  # "abcd" + "nm" + "{}" = 8 chars


# -- shapes some compatible servers send ------------------------------------------------


def test_arguments_as_an_object_become_the_json_string() -> None:
    assembler, _ = feed_all(
        [chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "add", "arguments": {"a": 1, "b": "é"}}}]})]
    )
    [call] = assembler.tool_calls()
    assert call.arguments == '{"a": 1, "b": "é"}'


def test_whole_calls_without_index_or_id_are_separate_calls() -> None:
    assembler, _ = feed_all(
        [
            chunk({"tool_calls": [call_delta(name="add", args='{"a": 1}')]}),
            chunk({"tool_calls": [call_delta(name="add", args='{"a": 2}')]}),
            chunk({"tool_calls": [call_delta(name="mul", args='{"a": 3}')]}),
        ]
    )
    calls = assembler.tool_calls()
    assert [(c.name, c.arguments) for c in calls] == [("add", '{"a": 1}'), ("add", '{"a": 2}'), ("mul", '{"a": 3}')]
    assert len({c.id for c in calls}) == 3


def test_a_name_repeated_on_every_delta_continues_the_call() -> None:
    assembler, _ = feed_all(
        [
            chunk({"tool_calls": [call_delta(index=0, id="x", name="add", args='{"a"')]}),
            chunk({"tool_calls": [call_delta(index=0, id="x", name="add", args=": 1}")]}),
            chunk({"tool_calls": [call_delta(index=0, id="x", name="add")]}),
        ]
    )
    assert [(c.id, c.name, c.arguments) for c in assembler.tool_calls()] == [("x", "add", '{"a": 1}')]


def test_reused_ids_within_one_answer_and_against_the_prompt() -> None:
    assembler, _ = feed_all(
        [
            chunk({"tool_calls": [call_delta(index=0, id="same", name="a", args="{}")]}),
            chunk({"tool_calls": [call_delta(index=1, id="same", name="b", args="{}")]}),
            chunk({}, "tool_calls"),
        ]
    )
    first = assembler.tool_calls()
    assert first[0].id == "same" and first[1].id != "same"
    taken = [Message.assistant(None, [ToolCall(id="same", name="a")])]
    ids = [c.id for c in assembler.response(taken).tool_calls]
    assert "same" not in ids and len(set(ids)) == 2


def test_reasoning_and_content_in_object_or_part_shapes() -> None:
    assembler, deltas = feed_all(
        [
            chunk({"reasoning": {"text": "step one"}}),
            chunk({"thinking": [{"type": "thinking", "text": " and two"}]}),
            chunk({"content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]}, "stop"),
        ]
    )
    assert (assembler.reasoning, assembler.text) == ("step one and two", "Hi!")
    assert [d.kind for d in deltas] == ["reasoning", "reasoning", "text"]


def test_junk_fields_are_ignored_not_fatal() -> None:
    assembler, deltas = feed_all(
        [
            {"choices": {"index": 0}},
            {"choices": 7},
            chunk({"tool_calls": {"index": 0}, "content": 5, "reasoning": ["x", 3]}),
            chunk({"tool_calls": [{"index": 0, "function": {"name": 9, "arguments": 12}}]}),
        ]
    )
    assert deltas == [StreamDelta("reasoning", "x")]
    assert assembler.tool_calls() == [] and not assembler.answered


def test_started_and_answered() -> None:
    reasoning_only, _ = feed_all([chunk({"reasoning_content": "hmm"}, "stop")])
    assert not reasoning_only.started and not reasoning_only.answered
    tool_only, _ = feed_all([chunk({"tool_calls": [call_delta(index=0, id="t", name="f", args="{}")]})])
    assert not tool_only.started and tool_only.answered
    text, _ = feed_all([chunk({"content": "a"})])
    assert text.started and text.answered


def test_hostile_deeply_nested_arguments_do_not_break_the_assembler() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    assembler, _ = feed_all(
        [
            chunk({"tool_calls": [call_delta(name="f", args=deep)]}),
            chunk({"tool_calls": [call_delta(name="g", args="{}")]}),
        ]
    )
    # Too deep to parse, so the second name cannot be told apart: the names join into
    # one unknown tool, which the loop answers with an error result; nothing raises.
    assert [c.name for c in assembler.tool_calls()] == ["fg"]


def test_json_on_the_wire_takes_what_the_stdlib_takes() -> None:
    # A tool schema from an MCP server may hold an integer past 64 bits; a provider may
    # send NaN. Both are valid for Python's json, which is the fallback.
    request = {"tools": [{"parameters": {"maximum": 2**70}}], "messages": [{"content": "café ✓"}]}
    assert json.loads(encode_json(request)) == request
    assert decode_json('{"usage": {"cost": NaN}}')["usage"]["cost"] != 0
    assert decode_json('{"n": 1}') == {"n": 1}
    with pytest.raises(ValueError):
        decode_json("not json")
