"""LLMClient against cut, empty and odd answers from the fake OpenAI server (127.0.0.1).

A call is complete only with a finish reason; anything else fails, retried while no
text has streamed out (same budget as HTTP errors), and an answer with nothing in it
gets exactly one retry.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from agent.llm import LLMClient, LLMError, StreamDelta
from agent.types import Message, ToolCall
from tests.fakes.openai_server import Call, FakeOpenAI, Reply

PROMPT = [Message.system("You are terse."), Message.user("hello")]


@pytest.fixture
async def client(fake: FakeOpenAI) -> AsyncIterator[LLMClient]:
    llm = LLMClient(
        model="gpt-test", base_url=fake.base_url, api_key="sk-test-key", request_timeout_s=10.0,
        max_retries=3, retry_base_s=0.01, retry_cap_s=0.05,
    )
    yield llm
    await llm.aclose()


async def fails(client: LLMClient, messages: list[Message] = PROMPT) -> tuple[LLMError, list[StreamDelta]]:
    seen: list[StreamDelta] = []

    async def on_delta(delta: StreamDelta) -> None:
        seen.append(delta)

    with pytest.raises(LLMError) as info:
        await client.complete(messages, None, on_delta)
    return info.value, seen


# -- no finish reason ----------------------------------------------------------------------


@pytest.mark.parametrize("done", [False, True], ids=["closed", "done-without-finish"])
async def test_a_stream_cut_after_text_fails_and_is_not_retried(
    fake: FakeOpenAI, client: LLMClient, done: bool
) -> None:
    fake.script(Reply.truncated(3, done=done, text="Hello! This is cut"), Reply.text("must not be used"))
    error, seen = await fails(client)
    assert error.kind == "incomplete" and error.started
    assert "finish_reason" in str(error)
    assert "".join(d.text for d in seen) == "Hello! T"  # it had streamed out: a retry would repeat it
    assert len(fake.requests) == 1


async def test_a_whole_answer_without_finish_reason_is_not_an_answer(fake: FakeOpenAI, client: LLMClient) -> None:
    fake.script(Reply.text("complete-looking text", omit_finish_reason=True))
    error, _ = await fails(client)
    assert error.kind == "incomplete"
    assert len(fake.requests) == 1


async def test_a_tool_call_cut_before_the_finish_is_retried_and_never_returned(
    fake: FakeOpenAI, client: LLMClient
) -> None:
    # The arguments are whole JSON, but the stream never said it was finished.
    write = Call("write_file", {"path": "x.txt", "content": "pwned"}, id="cut1")
    fake.script(Reply.tool_calls([write], args_as="whole", omit_finish_reason=True), Reply.text("Nothing to write."))
    response = await client.complete(PROMPT, None)
    assert response.tool_calls == []
    assert response.text == "Nothing to write."
    assert response.attempts == 2


async def test_cut_answers_use_the_retry_budget(fake: FakeOpenAI, client: LLMClient) -> None:
    fake.script(*[Reply.tool_calls([Call("add", {"a": 1})], cut_after=3) for _ in range(6)])
    error, _ = await fails(client)
    assert error.kind == "incomplete" and not error.started
    assert len(fake.requests) == 4  # max_retries = 3


# -- before the response started ------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [Reply.stream_error(after_chunks=0), Reply.disconnect(after_chunks=0), Reply.disconnect(after_chunks=1)],
    ids=["error-event-first", "disconnect-after-0", "disconnect-after-role-chunk"],
)
async def test_a_failure_right_after_the_headers_is_retried(fake: FakeOpenAI, client: LLMClient, fault: Reply) -> None:
    fake.script(fault, Reply.text("second time lucky"))
    response = await client.complete(PROMPT, None)
    assert response.text == "second time lucky"
    assert len(fake.requests) == 2


async def test_a_failure_before_the_start_says_so_not_midway(fake: FakeOpenAI, client: LLMClient) -> None:
    fake.script(*[Reply.stream_error(after_chunks=0, message="overloaded") for _ in range(4)])
    error, seen = await fails(client)
    assert error.kind == "stream" and not error.started and seen == []
    assert "before the answer started" in str(error) and "midway" not in str(error)
    assert "overloaded" in str(error)
    assert len(fake.requests) == 4


# -- no answer at all -------------------------------------------------------------------


@pytest.mark.parametrize(
    "empty",
    [
        Reply.text(""),
        Reply.truncated(0, done=True, text=""),
        Reply.text("hidden", no_choices=True),
        Reply.text("", reasoning="thinking only, no answer"),
        Reply.html(),
        Reply.raw(""),
        Reply.raw('{"id": "x", "object": "chat.completion"}'),
        Reply.text("a plain chat.completion", json_when_streamed=True),
    ],
    ids=["empty", "only-done", "no-choices", "only-reasoning", "html", "empty-body", "json-without-choices",
         "non-streamed-json"],
)
async def test_no_answer_gets_one_retry_then_fails(fake: FakeOpenAI, client: LLMClient, empty: Reply) -> None:
    fake.script(empty, empty, Reply.text("must not be used"))
    error, _ = await fails(client)
    assert error.kind == "empty" and error.retryable
    assert len(fake.requests) == 2  # one retry even though max_retries is 3
    assert fake.pending == 1


async def test_an_empty_answer_then_a_real_one_is_the_answer(fake: FakeOpenAI, client: LLMClient) -> None:
    fake.script(Reply.html(), Reply.text("here I am"))
    response = await client.complete(PROMPT, None)
    assert (response.text, response.finish_reason, response.attempts) == ("here I am", "stop", 2)


async def test_no_answer_names_the_content_type_for_the_operator(fake: FakeOpenAI, client: LLMClient) -> None:
    fake.script(Reply.html(), Reply.html())
    error, _ = await fails(client)
    assert "text/html" in str(error)


async def test_an_empty_answer_is_not_retried_without_budget(fake: FakeOpenAI) -> None:
    llm = LLMClient(model="m", base_url=fake.base_url, api_key="k", max_retries=0, retry_base_s=0.01)
    fake.script(Reply.text(""), Reply.text("must not be used"))
    error, _ = await fails(llm)
    await llm.aclose()
    assert error.kind == "empty"
    assert len(fake.requests) == 1


# -- stopped early ------------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["length", "content_filter"])
async def test_length_and_content_filter_are_answers_that_say_so(
    fake: FakeOpenAI, client: LLMClient, reason: str
) -> None:
    fake.script(Reply.text("The first part of a long", finish_reason=reason))
    response = await client.complete(PROMPT, None)
    assert response.finish_reason == reason
    assert response.text == "The first part of a long"
    assert len(fake.requests) == 1


async def test_length_with_nothing_visible_is_still_returned(fake: FakeOpenAI, client: LLMClient) -> None:
    fake.script(Reply.text("", reasoning="all the budget went here", finish_reason="length"))
    response = await client.complete(PROMPT, None)
    assert (response.text, response.finish_reason) == ("", "length")
    assert len(fake.requests) == 1


# -- shapes compatible servers send -------------------------------------------------------


@pytest.mark.parametrize("args_as", ["split", "whole", "object"])
@pytest.mark.parametrize("omit_index", [False, True], ids=["index", "no-index"])
async def test_tool_call_arguments_in_every_shape(
    fake: FakeOpenAI, client: LLMClient, args_as: str, omit_index: bool
) -> None:
    calls = [Call("add", {"a": 1, "b": 2}, id="c1"), Call("add", {"a": 3, "b": 4}, id="c2")]
    fake.script(Reply.tool_calls(calls, args_as=args_as, omit_tool_index=omit_index))
    response = await client.complete(PROMPT, None)
    assert [(c.id, c.name, json.loads(c.arguments)) for c in response.tool_calls] == [
        ("c1", "add", {"a": 1, "b": 2}), ("c2", "add", {"a": 3, "b": 4}),
    ]


@pytest.mark.parametrize("args_as", ["split", "whole", "object"])
async def test_reused_call_ids_are_made_unique(fake: FakeOpenAI, client: LLMClient, args_as: str) -> None:
    calls = [Call("add", {"a": 1}, id="call_0"), Call("add", {"a": 2}, id="call_0")]
    fake.script(Reply.tool_calls(calls, args_as=args_as))
    earlier = Message.assistant(None, [ToolCall(id="call_0", name="add", arguments="{}")])
    response = await client.complete([*PROMPT, earlier, Message.tool("call_0", "1")], None)
    ids = [c.id for c in response.tool_calls]
    assert [json.loads(c.arguments) for c in response.tool_calls] == [{"a": 1}, {"a": 2}]
    assert len(set(ids)) == 2 and "call_0" not in ids  # already answered earlier in the history


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "thinking"])
async def test_reasoning_under_any_name(fake: FakeOpenAI, client: LLMClient, field: str) -> None:
    fake.script(Reply.text("42", reasoning="six times seven", reasoning_field=field))
    response = await client.complete(PROMPT, None)
    assert (response.reasoning, response.text) == ("six times seven", "42")


# -- what the operator and the user get ----------------------------------------------------


async def test_rate_limit_keeps_the_server_wait(fake: FakeOpenAI) -> None:
    llm = LLMClient(model="m", base_url=fake.base_url, api_key="k", max_retries=2, request_timeout_s=2.0)
    fake.script(Reply.error(429, retry_after=60))
    error, _ = await fails(llm)
    await llm.aclose()
    assert error.kind == "rate_limit" and error.retry_after_s == 60
    assert len(fake.requests) == 1  # a 60 s wait cannot fit in a 2 s deadline


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"message": "This model's maximum context length is 8192 tokens.", "type": "invalid_request_error",
                   "param": "messages", "code": "context_length_exceeded"}},
        {"error": {"message": "prompt is too long: 210000 tokens > 200000 maximum", "type": "invalid_request_error"}},
    ],
    ids=["openai-code", "message-only"],
)
async def test_a_too_long_conversation_is_recognised(fake: FakeOpenAI, client: LLMClient, body: dict) -> None:
    fake.script(Reply.error(400, body=body))
    error, _ = await fails(client)
    assert error.kind == "bad_request" and error.context_exceeded
    assert len(fake.requests) == 1


async def test_other_bad_requests_are_not_context_errors(fake: FakeOpenAI, client: LLMClient) -> None:
    fake.script(Reply.error(400, message="Invalid 'tools[0].function.name'"))
    error, _ = await fails(client)
    assert error.kind == "bad_request" and not error.context_exceeded
