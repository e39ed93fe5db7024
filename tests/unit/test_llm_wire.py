"""Which way the chat request goes: straight with the SDK's headers, or through the SDK
where only it knows the way (a proxy, a redirect, a compressed stream)."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from agent.llm import LLMClient, RetryInfo
from agent.llm_errors import sdk_error, status_error
from agent.openai_sdk import openai
from agent.types import Message
from tests.fakes import serving_app
from tests.fakes.openai_server import FakeOpenAI, Reply

PROMPT = [Message.user("hello")]
API_KEY = "sk-test-WIRE0123456789abcdef"


def client_for(base_url: str) -> LLMClient:
    return LLMClient(model="gpt-test", base_url=base_url, api_key=API_KEY, max_retries=0, request_timeout_s=5.0)


@asynccontextmanager
async def serving(handler: web.Handler) -> AsyncIterator[str]:
    """A one-route server for ``POST /v1/chat/completions``; yields its base URL."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    async with serving_app(app) as url:
        yield url + "/v1"


@pytest.fixture(autouse=True)
def no_proxy_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


async def test_the_request_goes_straight_with_the_sdks_own_headers(fake: FakeOpenAI) -> None:
    fake.script(Reply.text("straight"))
    client = client_for(fake.base_url)
    sdk_headers = {**client._client.default_headers, **client._client.auth_headers}
    try:
        assert client._wire.direct
        assert (await client.complete(PROMPT, None)).text == "straight"
    finally:
        await client.aclose()
    sent = fake.request_headers[0]
    for name, value in sdk_headers.items():
        if isinstance(value, str):
            assert sent[name] == value, name
    assert sent["Authorization"] == f"Bearer {API_KEY}"
    assert sent["User-Agent"].startswith("AsyncOpenAI/Python")
    assert sent["Accept-Encoding"] == "identity"


async def test_a_proxy_in_the_environment_sends_through_the_sdk(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's address has nothing listening: only the proxy (the fake itself) can answer."""
    monkeypatch.setenv("HTTP_PROXY", fake.url)
    monkeypatch.setenv("NO_PROXY", "")
    fake.script(Reply.text("proxied"))
    client = client_for("http://127.0.0.1:9/v1")
    try:
        assert not client._wire.direct
        assert (await client.complete(PROMPT, None)).text == "proxied"
    finally:
        await client.aclose()


async def test_a_redirecting_endpoint_is_left_to_the_sdk_which_follows_it(fake: FakeOpenAI) -> None:
    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(fake.base_url + "/chat/completions")

    fake.script(Reply.text("first"), Reply.text("second"))
    async with serving(moved) as base_url:
        client = client_for(base_url)
        try:
            assert (await client.complete(PROMPT, None)).text == "first"
            assert not client._wire.direct  # for good: no second round trip to be redirected
            assert (await client.complete(PROMPT, None)).text == "second"
        finally:
            await client.aclose()


async def test_a_compressed_stream_is_left_to_the_sdk_which_decodes_it() -> None:
    events = (
        b'data: {"choices":[{"index":0,"delta":{"content":"zipped"},"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    calls: list[str] = []

    async def compressed(request: web.Request) -> web.Response:
        calls.append(request.headers.get("Accept-Encoding", ""))
        return web.Response(body=gzip.compress(events), headers={
            "Content-Type": "text/event-stream", "Content-Encoding": "gzip"})

    async with serving(compressed) as base_url:
        client = client_for(base_url)
        try:
            assert (await client.complete(PROMPT, None)).text == "zipped"
            assert not client._wire.direct
        finally:
            await client.aclose()
    assert calls[0] == "identity" and "gzip" in calls[1]


async def test_an_error_status_reads_the_same_either_way() -> None:
    """The straight route's status errors go through the same mapping as the SDK's."""
    body = {"error": {"message": f"context_length_exceeded for key {API_KEY}", "code": "context_length_exceeded"}}

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response(body, status=400)

    async with serving(refuse) as base_url:
        client = client_for(base_url)
        try:
            with pytest.raises(Exception) as straight:
                await client.complete(PROMPT, None)
            through_sdk: openai.APIError | None = None
            try:
                await client._client.post("/chat/completions", cast_to=dict, body={})
            except openai.APIError as exc:
                through_sdk = exc
        finally:
            await client.aclose()
    assert through_sdk is not None
    expected = sdk_error(through_sdk, API_KEY)
    assert str(straight.value) == str(expected)
    assert (straight.value.kind, straight.value.context_exceeded) == ("bad_request", True)  # type: ignore[attr-defined]
    assert API_KEY not in str(straight.value)
    assert str(status_error(400, body, {}, API_KEY)) == str(expected)


@pytest.mark.parametrize(("base_url", "api_key"), [
    ("http://127.0.0.1:9/v1?api-version=2024-10-01", API_KEY),  # the SDK's own way of joining a path
    ("http://127.0.0.1:9/v1", "sk-bad\r\nX-Injected: 1"),  # a header that cannot go out; the SDK says so
], ids=["query", "header"])
def test_what_only_the_sdk_knows_how_to_send_goes_through_it(base_url: str, api_key: str) -> None:
    assert not LLMClient(model="m", base_url=base_url, api_key=api_key)._wire.direct


async def test_an_oversized_error_body_is_not_read_whole_and_the_status_still_counts() -> None:
    """A hostile or broken server's error page past the cap: no message from it, the
    status still decides (a 500 is retried), and nothing of it is kept."""
    calls = 0

    async def flood(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        if calls == 2:
            return web.Response(status=200, content_type="text/event-stream", body=(
                b'data: {"choices":[{"index":0,"delta":{"content":"after"},"finish_reason":"stop"}]}\n\n'
                b"data: [DONE]\n\n"))
        return web.Response(status=500, body=b'{"error": {"message": "' + b"x" * (2 << 20) + b'"}}')

    async with serving(flood) as base_url:
        retries: list[RetryInfo] = []
        client = LLMClient(model="m", base_url=base_url, api_key=API_KEY, max_retries=1, retry_base_s=0.01,
                           request_timeout_s=5.0, on_retry=retries.append)
        try:
            assert (await client.complete(PROMPT, None)).text == "after"
        finally:
            await client.aclose()
    assert calls == 2
    assert [(r.error.kind, r.error.message) for r in retries] == [
        ("server", "The language model service had an error (HTTP 500).")]
