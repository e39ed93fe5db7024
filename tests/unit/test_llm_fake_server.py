"""The fake OpenAI server itself: wire format, control API, faults and the command line."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.fakes.openai_server import Call, FakeOpenAI, Reply

ROOT = Path(__file__).resolve().parents[2]


async def raw_stream(fake: FakeOpenAI, body: dict[str, object]) -> list[str]:
    """The raw SSE ``data:`` payloads of one streamed request."""
    async with aiohttp.ClientSession() as http, http.post(f"{fake.base_url}/chat/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        text = await resp.text()
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


async def test_stream_wire_format(fake: FakeOpenAI) -> None:
    fake.script(Reply.tool_calls([Call("f", {"k": "v"}, id="call_a")], text="ok", chunk_chars=5))
    payloads = await raw_stream(
        fake, {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True,
               "stream_options": {"include_usage": True}},
    )
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert chunks[1]["choices"][0]["delta"] == {"content": "ok"}
    head = chunks[2]["choices"][0]["delta"]["tool_calls"][0]
    assert head == {"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": ""}}
    pieces = [c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for c in chunks[3:-2]]
    assert "".join(pieces) == '{"k": "v"}' and len(pieces) == 2
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-1])


async def test_no_usage_chunk_unless_asked(fake: FakeOpenAI) -> None:
    payloads = await raw_stream(fake, {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True})
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_non_streaming_completion(fake: FakeOpenAI) -> None:
    fake.script(Reply.tool_calls([("f", {"a": 1})], text="calling", reasoning="why not"))
    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
    completion = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    await client.close()
    message = completion.choices[0].message
    assert message.content == "calling"
    assert message.tool_calls is not None and message.tool_calls[0].function.name == "f"
    assert json.loads(message.tool_calls[0].function.arguments) == {"a": 1}
    assert (message.model_extra or {})["reasoning_content"] == "why not"
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None and completion.usage.prompt_tokens > 0


async def test_default_responder_echoes_and_can_be_replaced(fake: FakeOpenAI) -> None:
    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    first = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": parts}])
    assert first.choices[0].message.content == "ab"

    async def responder(body: dict[str, object]) -> Reply:
        return Reply.text(f"{len(body['messages'])} messages")  # type: ignore[arg-type]

    fake.responder = responder
    second = await client.chat.completions.create(
        model="m", messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    )
    await client.close()
    assert second.choices[0].message.content == "2 messages"


async def test_api_key_is_enforced_when_configured() -> None:
    async with FakeOpenAI(api_key="right") as fake:
        wrong = openai.AsyncOpenAI(base_url=fake.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await wrong.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        await wrong.close()
        right = openai.AsyncOpenAI(base_url=fake.base_url, api_key="right", max_retries=0)
        models = await right.models.list()
        assert [m.id for m in models.data] == ["gpt-4o-mini"]
        await right.close()
        assert fake.requests == []  # rejected requests are not recorded


async def test_bad_requests_get_openai_style_errors(fake: FakeOpenAI) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{fake.base_url}/chat/completions", data=b"{nope") as resp:
            assert resp.status == 400
            assert "parse" in (await resp.json())["error"]["message"]
        async with http.post(f"{fake.base_url}/chat/completions", json={"model": "m"}) as resp:
            assert resp.status == 400
            assert "messages" in (await resp.json())["error"]["message"]


async def test_error_reply_sets_retry_after(fake: FakeOpenAI) -> None:
    fake.script(Reply.error(429, retry_after=7))
    url = f"{fake.base_url}/chat/completions"
    async with aiohttp.ClientSession() as http, http.post(url, json={"messages": []}) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "7"
        assert (await resp.json())["error"]["type"] == "rate_limit_exceeded"


async def test_disconnect_during_first_byte_delay_is_counted(fake: FakeOpenAI) -> None:
    fake.script(Reply.text("late", first_byte_delay_s=30))
    async with aiohttp.ClientSession() as http:
        request = asyncio.ensure_future(
            http.post(f"{fake.base_url}/chat/completions", json={"messages": [], "stream": True})
        )
        await fake.wait_for_requests(1)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
    assert await fake.disconnects.wait(1) == 1


async def test_control_api_scripts_records_and_resets(fake: FakeOpenAI) -> None:
    async with aiohttp.ClientSession() as http:
        replies = [
            {"text": "from control"},
            {"tool_calls": [{"name": "f", "arguments": {"x": 1}}]},
            {"status": 503, "retry_after": 1},
        ]
        async with http.post(f"{fake.url}/_fake/script", json={"replies": replies}) as resp:
            assert resp.status == 200 and (await resp.json()) == {"pending": 3}
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        first = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
        assert first.choices[0].message.content == "from control"
        second = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
        assert second.choices[0].message.tool_calls is not None
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
        await client.close()
        async with http.get(f"{fake.url}/_fake/requests") as resp:
            state = await resp.json()
        assert len(state["requests"]) == 3 and state["pending"] == 0 and state["disconnects"] == 0
        assert state["requests"][0]["messages"] == [{"role": "user", "content": "q"}]
        async with http.post(f"{fake.url}/_fake/config", json={"latency_ms": 5, "chunk_delay_ms": 1}) as resp:
            assert resp.status == 200
        assert (fake.latency_s, fake.chunk_delay_s) == (0.005, 0.001)
        async with http.post(f"{fake.url}/_fake/reset") as resp:
            assert resp.status == 200
        assert fake.requests == [] and fake.pending == 0


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"replies": [{"txt": "typo"}]}, "unknown reply field(s): txt"),
        ({"replies": [{"status": "500"}]}, "'status' has the wrong type"),
        ({"replies": [{"tool_calls": [{"arguments": {}}]}]}, "string 'name'"),
        ({"replies": "hi"}, "expected"),
        ([{"text": 5}], "'content' has the wrong type"),
    ],
)
async def test_control_api_rejects_bad_scripts_without_queueing_any(
    fake: FakeOpenAI, payload: object, message: str
) -> None:
    fake.script(Reply.text("kept"))
    async with aiohttp.ClientSession() as http, http.post(f"{fake.url}/_fake/script", json=payload) as resp:
        assert resp.status == 400
        assert message in (await resp.json())["error"]
    assert fake.pending == 1


async def test_control_api_rejects_bad_config(fake: FakeOpenAI) -> None:
    async with aiohttp.ClientSession() as http:
        for payload in ({"latency_ms": -1}, {"latency": 5}, {"latency_ms": "x"}):
            async with http.post(f"{fake.url}/_fake/config", json=payload) as resp:
                assert resp.status == 400, payload
    assert fake.latency_s == 0.0


def test_reply_json_round_trip_names() -> None:
    reply = Reply.from_json({"text": "a", "tool_calls": [{"name": "n", "arguments": "{}", "id": "c"}], "usage": False})
    assert reply.content == "a" and reply.calls == [Call("n", "{}", "c")] and reply.usage is False


async def test_command_line_server() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.fakes.openai_server", "--port", "0", "--latency-ms", "20",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
        assert line.startswith("listening on http://127.0.0.1:") and line.endswith("/v1")
        base_url = line.removeprefix("listening on ")
        client = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
        completion = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hey"}])
        await client.close()
        assert completion.choices[0].message.content == "hey"
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 10) == 0


# -- cut, empty and odd answers ---------------------------------------------------------

STREAM = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}


@pytest.mark.parametrize("done", [False, True])
async def test_truncated_stream_ends_cleanly_without_a_finish_reason(fake: FakeOpenAI, done: bool) -> None:
    fake.script(Reply.truncated(3, done=done, text="abcdefgh", chunk_chars=2))
    payloads = await raw_stream(fake, STREAM)
    assert (payloads[-1] == "[DONE]") is done
    chunks = [json.loads(p) for p in payloads if p != "[DONE]"]
    assert len(chunks) == 3
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)


async def test_omitted_finish_reason_and_no_choices(fake: FakeOpenAI) -> None:
    fake.script(Reply.text("hi", omit_finish_reason=True), Reply.text("hi", no_choices=True))
    first = [json.loads(p) for p in (await raw_stream(fake, STREAM))[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in first) == "hi"
    assert all(c["choices"][0]["finish_reason"] is None for c in first)
    second = [json.loads(p) for p in (await raw_stream(fake, STREAM))[:-1]]
    assert second and all(c["choices"] == [] for c in second)


@pytest.mark.parametrize(("args_as", "arguments"), [("whole", '{"k": "v"}'), ("object", {"k": "v"})])
async def test_tool_call_sent_whole_or_with_object_arguments(fake: FakeOpenAI, args_as: str, arguments: object) -> None:
    fake.script(Reply.tool_calls([Call("f", {"k": "v"}, id="c")], args_as=args_as, omit_tool_index=True))
    chunks = [json.loads(p) for p in (await raw_stream(fake, STREAM))[:-1]]
    deltas = [c["choices"][0]["delta"]["tool_calls"] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    assert deltas == [[{"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]]


@pytest.mark.parametrize(
    ("reply", "content_type", "body"),
    [
        (Reply.html(), "text/html", "<!DOCTYPE html>"),
        (Reply.raw(""), "application/json", ""),
        (Reply.text("plain", json_when_streamed=True), "application/json", '"object": "chat.completion"'),
    ],
)
async def test_bodies_that_are_no_event_stream(fake: FakeOpenAI, reply: Reply, content_type: str, body: str) -> None:
    fake.script(reply)
    async with aiohttp.ClientSession() as http, http.post(f"{fake.base_url}/chat/completions", json=STREAM) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith(content_type)
        text = await resp.text()
    assert body in text if body else text == ""


async def test_control_api_accepts_the_new_fields(fake: FakeOpenAI) -> None:
    replies = [{"text": "cut", "cut_after": 2, "done_after_cut": True}, {"raw_body": "<p>", "content_type": "text/html"},
               {"tool_calls": [{"name": "f", "arguments": {"a": 1}}], "args_as": "object"}]
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{fake.url}/_fake/script", json={"replies": replies}) as resp:
            assert resp.status == 200 and (await resp.json())["pending"] == 3
        async with http.post(f"{fake.url}/_fake/script", json=[{"cut_after": "two"}]) as resp:
            assert resp.status == 400 and "cut_after" in (await resp.json())["error"]


async def test_timings_record_arrival_and_last_byte_of_streamed_answers(fake: FakeOpenAI) -> None:
    fake.script(Reply.text("one", chunk_delay_s=0.05), Reply.error(500), Reply.disconnect(after_chunks=1))
    before = time.monotonic()
    payloads = await raw_stream(fake, {"messages": [{"role": "user", "content": "first mk1"}], "stream": True})
    assert payloads[-1] == "[DONE]"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{fake.base_url}/chat/completions",
                             json={"messages": [{"role": "user", "content": "second"}], "stream": True}) as resp:
            assert resp.status == 500
        with pytest.raises(aiohttp.ClientError):
            async with http.post(f"{fake.base_url}/chat/completions",
                                 json={"messages": [{"role": "user", "content": "third"}], "stream": True}) as resp:
                await resp.read()
        async with http.get(f"{fake.url}/_fake/timings", params={"since": "1"}) as resp:
            later = (await resp.json())["timings"]
        async with http.get(f"{fake.url}/_fake/timings") as resp:
            timings = (await resp.json())["timings"]
        async with http.get(f"{fake.url}/_fake/timings", params={"since": "x"}) as resp:
            assert resp.status == 400
    first = timings[0]
    assert first["index"] == 0 and first["last_user"] == "first mk1"
    # The answer is streamed over several chunks 50 ms apart: its last byte comes well after arrival.
    assert before <= first["arrived"] < first["last_byte"] <= time.monotonic()
    assert first["last_byte"] - first["arrived"] >= 0.05
    # An error answer and a dropped stream have no last byte of an answer.
    assert [(t["index"], t["last_user"], t["last_byte"]) for t in later] == [(1, "second", None), (2, "third", None)]
    fake.reset()
    assert fake.timings == []
