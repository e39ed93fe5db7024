"""LLMClient against the fake OpenAI server over 127.0.0.1, through the real ``openai`` package."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from agent.llm import LLMClient, LLMError, RetryInfo, StreamDelta, estimate_tokens, redact
from agent.types import Message
from tests.fakes.openai_server import Call, FakeOpenAI, Reply

API_KEY = "sk-test-SECRETSECRET0123456789"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
        },
    }
]


def make_client(fake: FakeOpenAI, retries: list[RetryInfo] | None = None, **kw: object) -> LLMClient:
    options: dict[str, object] = {
        "model": "gpt-test",
        "base_url": fake.base_url,
        "api_key": API_KEY,
        "max_output_tokens": 256,
        "request_timeout_s": 10.0,
        "max_retries": 3,
        "retry_base_s": 0.01,
        "retry_cap_s": 0.05,
    }
    options.update(kw)
    if retries is not None:
        options["on_retry"] = retries.append
    return LLMClient(**options)  # type: ignore[arg-type]


PROMPT = [Message.system("You are terse."), Message.user("hello")]


async def test_text_reply_streams_deltas_and_sends_the_expected_request(fake: FakeOpenAI) -> None:
    fake.script(Reply.text("Hello there, friend!", chunk_chars=3))
    client = make_client(fake)
    deltas: list[StreamDelta] = []

    async def on_delta(delta: StreamDelta) -> None:
        deltas.append(delta)

    response = await client.complete(PROMPT, TOOLS, on_delta)
    await client.aclose()

    assert response.text == "Hello there, friend!"
    assert response.tool_calls == []
    assert response.finish_reason == "stop"
    assert response.attempts == 1
    assert [d.text for d in deltas] == ["Hel", "lo ", "the", "re,", " fr", "ien", "d!"]
    assert all(d.kind == "text" for d in deltas)
    body = fake.requests[0]
    assert body["model"] == "gpt-test"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 256  # a compatible server gets max_tokens
    assert body["tools"] == TOOLS
    assert body["messages"] == [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello"}]
    assert fake.request_headers[0]["Authorization"] == f"Bearer {API_KEY}"


async def test_tools_none_sends_no_tools_key(fake: FakeOpenAI) -> None:
    client = make_client(fake)
    await client.complete(PROMPT, None)
    await client.aclose()
    assert "tools" not in fake.requests[0]


async def test_tool_calls_accumulate_across_chunks(fake: FakeOpenAI) -> None:
    fake.script(
        Reply.tool_calls(
            [Call("add", {"a": 1, "b": 2}, id="call_1"), Call("add", '{"a": 10, "b": 20}', id="call_2")],
            text="Let me add.",
            chunk_chars=2,
        )
    )
    client = make_client(fake)
    response = await client.complete(PROMPT, TOOLS)
    await client.aclose()
    assert response.text == "Let me add."
    assert response.finish_reason == "tool_calls"
    assert [(c.id, c.name, json.loads(c.arguments)) for c in response.tool_calls] == [
        ("call_1", "add", {"a": 1, "b": 2}),
        ("call_2", "add", {"a": 10, "b": 20}),
    ]


async def test_tool_call_deltas_without_index(fake: FakeOpenAI) -> None:
    fake.script(
        Reply.tool_calls([Call("add", {"a": 1, "b": 2}), Call("add", {"a": 3, "b": 4})], omit_tool_index=True)
    )
    client = make_client(fake)
    response = await client.complete(PROMPT, TOOLS)
    await client.aclose()
    assert [json.loads(c.arguments) for c in response.tool_calls] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    assert len({c.id for c in response.tool_calls}) == 2


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "thinking"])
async def test_reasoning_is_surfaced_from_extra_fields(fake: FakeOpenAI, field: str) -> None:
    fake.script(Reply.text("42", reasoning="six times seven", reasoning_field=field))
    client = make_client(fake)
    deltas: list[StreamDelta] = []

    async def on_delta(delta: StreamDelta) -> None:
        deltas.append(delta)

    response = await client.complete(PROMPT, None, on_delta)
    await client.aclose()
    assert response.reasoning == "six times seven"
    assert response.text == "42"
    assert "".join(d.text for d in deltas if d.kind == "reasoning") == "six times seven"
    assert deltas[0].kind == "reasoning"


async def test_usage_from_the_api(fake: FakeOpenAI) -> None:
    fake.script(Reply.text("hi", usage={"prompt_tokens": 123, "completion_tokens": 7}))
    client = make_client(fake)
    response = await client.complete(PROMPT, None)
    await client.aclose()
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (123, 7)
    assert response.usage.estimated is False


async def test_usage_estimated_when_absent(fake: FakeOpenAI) -> None:
    fake.script(Reply.text("abcdefghi", usage=False))
    client = make_client(fake)
    response = await client.complete(PROMPT, None)
    await client.aclose()
    # "You are terse." (14) + "hello" (5) = 19 chars -> 5 tokens, + 16 per message (2).
    assert response.usage.prompt_tokens == 5 + 32 == estimate_tokens(PROMPT)
    assert response.usage.completion_tokens == 3  # 9 chars -> ceil(9/4)
    assert response.usage.estimated is True


async def test_429_with_retry_after_is_honoured_then_succeeds(fake: FakeOpenAI) -> None:
    fake.script(Reply.error(429, retry_after="0.03"), Reply.text("ok"))
    retries: list[RetryInfo] = []
    client = make_client(fake, retries, retry_base_s=5.0, retry_cap_s=1.0)
    response = await client.complete(PROMPT, None)
    await client.aclose()
    assert response.text == "ok"
    assert response.attempts == 2
    assert len(fake.requests) == 2
    assert [(r.attempt, r.wait_s, r.error.kind) for r in retries] == [(1, 0.03, "rate_limit")]


async def test_retry_after_is_capped(fake: FakeOpenAI) -> None:
    fake.script(Reply.error(429, retry_after=3600), Reply.text("ok"))
    retries: list[RetryInfo] = []
    client = make_client(fake, retries, retry_cap_s=0.05)
    response = await client.complete(PROMPT, None)
    await client.aclose()
    assert response.text == "ok"
    assert [r.wait_s for r in retries] == [0.05]


async def test_retry_that_would_pass_the_deadline_fails_at_once(fake: FakeOpenAI) -> None:
    fake.script(Reply.error(429, retry_after=30), Reply.text("never"))
    client = make_client(fake, retry_cap_s=60.0, request_timeout_s=2.0)
    with pytest.raises(LLMError) as info:
        await asyncio.wait_for(client.complete(PROMPT, None), 1.5)
    await client.aclose()
    assert info.value.kind == "rate_limit"
    assert info.value.retryable is True
    assert info.value.status == 429
    assert len(fake.requests) == 1


async def test_500_then_success(fake: FakeOpenAI) -> None:
    fake.script(Reply.error(500), Reply.error(503), Reply.text("recovered"))
    retries: list[RetryInfo] = []
    client = make_client(fake, retries)
    response = await client.complete(PROMPT, None)
    await client.aclose()
    assert response.text == "recovered"
    assert response.attempts == 3
    assert [r.error.status for r in retries] == [500, 503]
    assert all(0 < r.wait_s <= 0.05 for r in retries)


async def test_retries_are_bounded(fake: FakeOpenAI) -> None:
    fake.script(*[Reply.error(500) for _ in range(5)])
    client = make_client(fake, max_retries=2)
    with pytest.raises(LLMError) as info:
        await client.complete(PROMPT, None)
    await client.aclose()
    assert info.value.kind == "server"
    assert info.value.status == 500
    assert len(fake.requests) == 3
    assert fake.pending == 2


async def test_auth_error_is_not_retried_and_hides_the_key(fake: FakeOpenAI) -> None:
    fake.script(Reply.error(401, message=f"Incorrect API key provided: {API_KEY}."))
    client = make_client(fake)
    with pytest.raises(LLMError) as info:
        await client.complete(PROMPT, None)
    await client.aclose()
    assert info.value.kind == "auth"
    assert info.value.retryable is False
    assert len(fake.requests) == 1
    assert "SECRET" not in str(info.value) and "SECRET" not in repr(info.value)


async def test_bad_request_keeps_the_server_message_but_masks_secrets(fake: FakeOpenAI) -> None:
    fake.script(Reply.error(400, message=f"context too long; your key {API_KEY} and sk-other-ABCDEFGHIJ"))
    client = make_client(fake)
    with pytest.raises(LLMError) as info:
        await client.complete(PROMPT, None)
    await client.aclose()
    assert info.value.kind == "bad_request"
    assert "context too long" in str(info.value)
    assert "SECRET" not in str(info.value) and "ABCDEFGHIJ" not in str(info.value)
    assert len(fake.requests) == 1


async def test_error_mid_stream_is_not_retried(fake: FakeOpenAI) -> None:
    fake.script(Reply.stream_error(after_chunks=3, message="The server had an error processing your request"))
    fake.script(Reply.text("must not be used"))
    client = make_client(fake)
    seen: list[StreamDelta] = []

    async def on_delta(delta: StreamDelta) -> None:
        seen.append(delta)

    with pytest.raises(LLMError) as info:
        await client.complete(PROMPT, None, on_delta)
    await client.aclose()
    assert info.value.kind == "stream"
    assert "server had an error" in str(info.value)
    assert len(fake.requests) == 1
    assert seen  # the first bytes had already arrived


async def test_disconnect_mid_stream_is_an_error_without_retry(fake: FakeOpenAI) -> None:
    fake.script(Reply.disconnect(after_chunks=2), Reply.text("must not be used"))
    client = make_client(fake)
    with pytest.raises(LLMError) as info:
        await client.complete(PROMPT, None)
    await client.aclose()
    assert info.value.kind == "stream"
    assert len(fake.requests) == 1


async def test_garbage_sse_is_a_protocol_error(fake: FakeOpenAI) -> None:
    fake.script(Reply.garbage(after_chunks=2), Reply.text("must not be used"))
    client = make_client(fake)
    with pytest.raises(LLMError) as info:
        await client.complete(PROMPT, None)
    await client.aclose()
    assert info.value.kind == "protocol"
    assert len(fake.requests) == 1


async def test_connection_refused_is_retried_then_fails() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    retries: list[RetryInfo] = []
    client = LLMClient(
        model="m", base_url=f"http://127.0.0.1:{port}/v1", api_key=API_KEY, max_retries=2,
        retry_base_s=0.01, retry_cap_s=0.02, on_retry=retries.append,
    )
    with pytest.raises(LLMError) as info:
        await client.complete(PROMPT, None)
    await client.aclose()
    assert info.value.kind == "connection"
    assert [r.attempt for r in retries] == [1, 2]


async def test_whole_call_is_bounded_by_request_timeout(fake: FakeOpenAI) -> None:
    fake.script(Reply.text("slow", first_byte_delay_s=30))
    client = make_client(fake, request_timeout_s=0.3)
    with pytest.raises(LLMError) as info:
        await asyncio.wait_for(client.complete(PROMPT, None), 10)
    await client.aclose()
    assert info.value.kind == "timeout"
    await fake.disconnects.wait(1)


async def test_slow_stream_is_bounded_too(fake: FakeOpenAI) -> None:
    fake.script(Reply.text("x" * 100, chunk_chars=1, chunk_delay_s=0.05))
    client = make_client(fake, request_timeout_s=0.3)
    with pytest.raises(LLMError) as info:
        await asyncio.wait_for(client.complete(PROMPT, None), 10)
    await client.aclose()
    assert info.value.kind == "timeout"
    await fake.disconnects.wait(1)


async def test_cancellation_closes_the_stream(fake: FakeOpenAI) -> None:
    fake.script(Reply.text("y" * 200, chunk_chars=1, chunk_delay_s=0.05))
    client = make_client(fake)
    first = asyncio.Event()

    async def on_delta(delta: StreamDelta) -> None:
        first.set()

    task = asyncio.create_task(client.complete(PROMPT, None, on_delta))
    await asyncio.wait_for(first.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    await fake.disconnects.wait(1)
    await client.aclose()


async def test_official_endpoint_uses_max_completion_tokens(fake: FakeOpenAI) -> None:
    client = make_client(fake)
    assert client._request(PROMPT, None)["max_tokens"] == 256
    official = LLMClient(model="gpt-4o-mini", api_key=API_KEY, max_output_tokens=99)
    assert official._request(PROMPT, None)["max_completion_tokens"] == 99
    await official.aclose()
    await client.aclose()


def test_configuration_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="api_key"):
        LLMClient(model="gpt-4o-mini")
    with pytest.raises(ValueError, match="request_timeout_s"):
        LLMClient(model="m", base_url="http://127.0.0.1:1/v1", request_timeout_s=0)


def test_redact_masks_the_secret_and_key_shapes() -> None:
    assert redact("use sk-proj-abcdefgh123 now") == "use sk-*** now"
    assert redact("token my-own-secret-value here", "my-own-secret-value") == "token *** here"
    assert redact("a normal key format message") == "a normal key format message"


async def test_local_server_without_a_key_gets_a_placeholder(fake: FakeOpenAI) -> None:
    client = LLMClient(model="m", base_url=fake.base_url)
    response = await client.complete([Message.user("ping")], None)
    await client.aclose()
    assert response.text == "ping"  # the fake's default responder echoes the last user message
    assert fake.request_headers[0]["Authorization"] == "Bearer no-key"


async def test_check_lists_models_and_reports_failures() -> None:
    async with FakeOpenAI(api_key=API_KEY, models=["m1", "m2"]) as fake:
        good = make_client(fake)
        assert await good.check() == ["m1", "m2"]
        await good.aclose()
        bad = make_client(fake, api_key="sk-wrong-key-0000000")
        with pytest.raises(LLMError) as info:
            await bad.check()
        await bad.aclose()
        assert info.value.kind == "auth"


async def test_a_failing_retry_callback_does_not_break_the_call(fake: FakeOpenAI) -> None:
    def on_retry(info: RetryInfo) -> None:
        raise RuntimeError("metrics down")

    fake.script(Reply.error(502), Reply.text("fine"))
    client = make_client(fake, on_retry=on_retry)
    response = await client.complete(PROMPT, None)
    await client.aclose()
    assert response.text == "fine" and response.attempts == 2
