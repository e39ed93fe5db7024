"""A fake OpenAI-compatible chat-completions server (aiohttp), for tests and benchmarks.

It speaks the real wire format, so the official ``openai`` client (and anything
built on it) runs against it unchanged:

* ``POST /v1/chat/completions`` — streaming (``"stream": true``: Server-Sent Events,
  ``data: {chat.completion.chunk}\\n\\n`` … ``data: [DONE]\\n\\n``; a final usage chunk
  with ``"choices": []`` when ``stream_options.include_usage`` is set) and
  non-streaming (one ``chat.completion`` JSON object).
* ``GET /v1/models`` — the model list (for health checks); ``FakeOpenAI(serve_models=False)``
  answers 404 there, like the many compatible servers that have no such route.

With ``FakeOpenAI(api_key="…")`` both answer 401 unless ``Authorization: Bearer …`` matches.

In-process use (binds 127.0.0.1 on a free port)::

    from tests.fakes.openai_server import Call, FakeOpenAI, Reply

    async with FakeOpenAI() as fake:
        fake.script(
            Reply.tool_calls([Call("add", {"a": 1, "b": 2})]),   # first request
            Reply.text("The sum is 3."),                        # second request
        )
        client = AsyncOpenAI(base_url=fake.base_url, api_key="test")
        ...
        assert fake.requests[1]["messages"][-1]["role"] == "tool"
        await fake.disconnects.wait(1)        # a client hung up mid-reply

Replies are taken from the FIFO script; when it is empty the *responder* answers
(a callable receiving the request JSON and returning a ``Reply``, sync or async;
the default echoes the text of the last user message).

Reply kinds (all are ``Reply`` instances; keyword arguments combine freely):

* ``Reply.text("hi", reasoning="…", usage=False, chunk_chars=4)`` — text in small
  content chunks; ``reasoning`` is streamed first in ``reasoning_field``
  (default ``reasoning_content``); ``usage`` True (computed, sent when asked for),
  False (never sent) or an explicit dict.
* ``Reply.tool_calls([Call("name", {"x": 1}), ("other", '{"raw": ')], text="")`` —
  each call streamed as name first, then its arguments in pieces;
  ``omit_tool_index=True`` leaves ``index`` out of every tool-call delta.
* ``Reply.error(429, retry_after=2)`` — an HTTP error before any byte of a body.
* ``Reply.disconnect(after_chunks=2)`` — the connection is dropped mid-stream.
* ``Reply.garbage(after_chunks=1)`` — an unparsable ``data:`` line mid-stream.
* ``Reply.stream_error(after_chunks=1)`` — an in-stream ``{"error": …}`` event (what
  OpenAI sends when a server error happens after the 200 headers), then the end.
* ``Reply.truncated(after_chunks=3, done=False)`` — the stream ends cleanly after that
  many events, without a finish_reason (``done``: with ``data: [DONE]`` anyway);
  ``after_chunks=0`` with ``done=True`` is a stream of only ``[DONE]``.
* ``Reply.raw(body, content_type)`` / ``Reply.html()`` — a 200 with that body verbatim
  (e.g. an empty body, a JSON object without ``choices``, an HTML page).
* ``json_when_streamed=True`` — a plain ``chat.completion`` JSON body even when a stream
  was asked for; ``omit_finish_reason=True`` — the whole answer with ``finish_reason``
  null; ``no_choices=True`` — every chunk has ``"choices": []``;
  ``finish_reason="length"`` / ``"content_filter"`` — an answer the model stopped early;
  ``args_as="whole"`` / ``"object"`` — each tool call in one delta, its arguments one
  string or a JSON object (default ``"split"``: name first, arguments in pieces);
  ``reasoning_field="reasoning"`` / ``"thinking"`` — where reasoning goes.
* ``first_byte_delay_s`` / ``chunk_delay_s`` on any reply override the server's
  ``latency_s`` (before the first byte) and ``chunk_delay_s`` (between chunks).

Recording: ``fake.requests`` (every request body, in order), ``fake.request_headers``,
``fake.timings`` (arrival and last-byte times, see ``/_fake/timings``),
``fake.disconnects`` (an ``EventCounter``: ``.count`` and ``await .wait(n)``; counts
clients that hung up before the reply was complete), ``await fake.wait_for_requests(n)``,
``fake.image_urls(i)`` (the image parts of a request).

HTTP control API (for subprocess tests and bench scripts):

* ``POST /_fake/script`` — body ``{"replies": [reply, …]}`` (or a bare list); a reply is
  a JSON object of ``Reply`` fields, e.g. ``{"text": "hi"}``,
  ``{"tool_calls": [{"name": "add", "arguments": {"a": 1}}]}``, ``{"status": 500}``.
* ``GET /_fake/requests`` — ``{"requests": […], "disconnects": n, "pending": k}``.
* ``GET /_fake/timings?since=N`` — ``{"timings": [{"index", "arrived", "last_byte",
  "last_user"}, …]}`` for the requests from index N on: ``time.monotonic()`` when each
  request arrived and when the last byte of its streamed answer was written (null for
  any other answer), and the start of its last user message. CLOCK_MONOTONIC is
  system-wide on Linux, so a benchmark in another process compares them with its own.
* ``POST /_fake/reset`` — clears the script, the recordings and the counters.
* ``POST /_fake/config`` — ``{"latency_ms": 200, "chunk_delay_ms": 5}``.

Command line: ``python -m tests.fakes.openai_server --port 0 --latency-ms 200``
prints ``listening on http://127.0.0.1:PORT/v1`` once ready and serves until
SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import math
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from tests.fakes.openai_wire import Call, Reply, completion_body, stream_chunks

__all__ = ["Call", "EventCounter", "FakeOpenAI", "Reply", "RequestTiming", "echo_last_user", "main"]

Responder = Callable[[dict[str, Any]], "Reply | Awaitable[Reply]"]


class EventCounter:
    """A counter tests can await: ``await counter.wait(2)`` returns once it reaches 2."""

    def __init__(self) -> None:
        self._count = 0
        self._changed = asyncio.Event()

    @property
    def count(self) -> int:
        return self._count

    def __int__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"EventCounter({self._count})"

    def increment(self) -> None:
        self._count += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def reset(self) -> None:
        self._count = 0

    async def wait(self, n: int = 1, timeout_s: float = 5.0) -> int:
        """Wait until the count is at least ``n``; raises TimeoutError after ``timeout_s``."""
        async with asyncio.timeout(timeout_s):
            while self._count < n:
                await self._changed.wait()
        return self._count


def echo_last_user(body: dict[str, Any]) -> Reply:
    """The default responder: answer with the text of the last user message."""
    return Reply.text(last_user_text_of(body))


@dataclass
class RequestTiming:
    """When a chat request arrived and when its streamed answer's last byte was written
    (``time.monotonic()``; ``last_byte`` None until then, or for an answer cut short)."""

    index: int
    arrived: float
    last_user: str
    last_byte: float | None = None


def last_user_text_of(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def image_urls(body: dict[str, Any]) -> list[str]:
    """Every ``image_url`` part of the user messages in a request body, in order."""
    urls: list[str] = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if message.get("role") == "user" and isinstance(content, list):
            urls += [str(p["image_url"]["url"]) for p in content
                     if isinstance(p, dict) and p.get("type") == "image_url" and isinstance(p.get("image_url"), dict)]
    return urls


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class _ClientGone(Exception):
    """The client closed the connection while we were writing."""


class FakeOpenAI:
    """The fake server; an async context manager that starts and stops it."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency_s: float = 0.0,
        chunk_delay_s: float = 0.0,
        responder: Responder | None = None,
        api_key: str | None = None,
        models: Iterable[str] = ("gpt-4o-mini",),
        serve_models: bool = True,
    ) -> None:
        self.host = host
        self.port = port
        self.latency_s = latency_s
        self.chunk_delay_s = chunk_delay_s
        self.responder: Responder = responder or echo_last_user
        self.api_key = api_key
        self.models = list(models)
        self.serve_models = serve_models
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self.timings: list[RequestTiming] = []
        self.disconnects = EventCounter()
        self._received = EventCounter()
        self._script: deque[Reply] = deque()
        self._runner: web.AppRunner | None = None
        self._closing = False

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> FakeOpenAI:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/_fake/script", self._control_script)
        app.router.add_get("/_fake/requests", self._control_requests)
        app.router.add_get("/_fake/timings", self._control_timings)
        app.router.add_post("/_fake/reset", self._control_reset)
        app.router.add_post("/_fake/config", self._control_config)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self

    async def close(self) -> None:
        self._closing = True
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeOpenAI:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What to pass as ``base_url`` to an OpenAI client."""
        return f"{self.url}/v1"

    # -- scripting -------------------------------------------------------------------
    def script(self, *replies: Reply) -> None:
        """Queue replies; each request takes the oldest one."""
        self._script.extend(replies)

    @property
    def pending(self) -> int:
        return len(self._script)

    def reset(self) -> None:
        self._script.clear()
        self.requests.clear()
        self.request_headers.clear()
        self.timings.clear()
        self.disconnects.reset()
        self._received.reset()

    def image_urls(self, index: int = -1) -> list[str]:
        """The ``image_url`` parts of the user messages of request ``index`` (data URLs)."""
        return image_urls(self.requests[index])

    async def wait_for_requests(self, n: int, timeout_s: float = 5.0) -> None:
        """Wait until at least ``n`` chat requests have arrived."""
        await self._received.wait(n, timeout_s)

    # -- handlers --------------------------------------------------------------------
    def _unauthorized(self, request: web.Request) -> web.Response | None:
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _error_response(Reply.error(401, message="Incorrect API key provided."))
        return None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        denied = self._unauthorized(request)
        if denied is not None:
            return denied
        try:
            body = await request.json()
        except ValueError:
            return _error_response(Reply.error(400, message="We could not parse the JSON body of your request."))
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error_response(Reply.error(400, message="'messages' is a required property"))
        self.requests.append(body)
        self.request_headers.append(dict(request.headers))
        timing = RequestTiming(len(self.requests) - 1, arrived, last_user_text_of(body)[:200])
        self.timings.append(timing)
        self._received.increment()
        reply = self._script.popleft() if self._script else await self._respond(body)
        state = {"done": False, "streamed": False}
        try:
            response = await self._answer(request, body, reply, state)
            if state["streamed"]:
                timing.last_byte = time.monotonic()
            return response
        except _ClientGone:
            self._count_disconnect(state)
            return web.Response(status=499)
        except asyncio.CancelledError:
            self._count_disconnect(state)
            raise

    def _count_disconnect(self, state: dict[str, bool]) -> None:
        if not state["done"] and not self._closing:
            state["done"] = True
            self.disconnects.increment()

    async def _respond(self, body: dict[str, Any]) -> Reply:
        result = self.responder(body)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _answer(
        self, request: web.Request, body: dict[str, Any], reply: Reply, state: dict[str, bool]
    ) -> web.StreamResponse:
        first_delay = self.latency_s if reply.first_byte_delay_s is None else reply.first_byte_delay_s
        if first_delay > 0:
            await asyncio.sleep(first_delay)
        if reply.status != 200:
            state["done"] = True
            return _error_response(reply)
        if reply.raw_body is not None:
            state["done"] = True
            return web.Response(body=reply.raw_body.encode(), headers={"Content-Type": reply.content_type})
        if body.get("stream") and not reply.json_when_streamed:
            return await self._stream(request, body, reply, state)
        return await self._complete(request, body, reply, state)

    async def _complete(
        self, request: web.Request, body: dict[str, Any], reply: Reply, state: dict[str, bool]
    ) -> web.StreamResponse:
        state["done"] = True
        if reply.disconnect_after is not None:
            _abort(request)
            raise asyncio.CancelledError
        if reply.garbage_after is not None:
            return web.Response(text="{not json", content_type="application/json")
        if reply.stream_error_after is not None:
            return _error_response(Reply.error(500, body=reply.body))
        return web.json_response(completion_body(body, reply))

    async def _stream(
        self, request: web.Request, body: dict[str, Any], reply: Reply, state: dict[str, bool]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        delay = self.chunk_delay_s if reply.chunk_delay_s is None else reply.chunk_delay_s
        for sent, chunk in enumerate(stream_chunks(body, reply)):
            if sent == reply.disconnect_after:
                state["done"] = True
                _abort(request)
                raise asyncio.CancelledError
            if sent == reply.garbage_after:
                await _write(resp, b"data: {this is not json\n\n")
                break
            if sent == reply.stream_error_after:
                await _write(resp, b"data: " + json.dumps(reply.body).encode() + b"\n\n")
                break
            if sent == reply.cut_after:
                if reply.done_after_cut:
                    await _write(resp, b"data: [DONE]\n\n")
                break
            if sent and delay > 0:
                await asyncio.sleep(delay)
            await _write(resp, b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
        else:
            await _write(resp, b"data: [DONE]\n\n")
        state["done"] = True
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
            state["streamed"] = True
        return resp

    async def _models(self, request: web.Request) -> web.Response:
        if not self.serve_models:
            return web.json_response({"error": {"message": "Not Found", "type": "not_found"}}, status=404)
        denied = self._unauthorized(request)
        if denied is not None:
            return denied
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _control_script(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            items = data.get("replies") if isinstance(data, dict) else data
            if not isinstance(items, list):
                raise ValueError("expected {'replies': [...]} or a list of replies")
            replies = [Reply.from_json(item) for item in items]
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        self.script(*replies)
        return web.json_response({"pending": self.pending})

    async def _control_requests(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"requests": self.requests, "disconnects": self.disconnects.count, "pending": self.pending}
        )

    async def _control_timings(self, request: web.Request) -> web.Response:
        try:
            since = max(0, int(request.query.get("since", "0")))
        except ValueError:
            return web.json_response({"error": "since must be an integer"}, status=400)
        return web.json_response({"timings": [asdict(t) for t in self.timings[since:]]})

    async def _control_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"ok": True})

    async def _control_config(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            if not isinstance(data, dict) or set(data) - {"latency_ms", "chunk_delay_ms"}:
                raise ValueError("expected an object with latency_ms and/or chunk_delay_ms")
            latency = float(data.get("latency_ms", self.latency_s * 1000)) / 1000
            chunk = float(data.get("chunk_delay_ms", self.chunk_delay_s * 1000)) / 1000
            if latency < 0 or chunk < 0 or not math.isfinite(latency + chunk):
                raise ValueError("delays must be finite and non-negative")
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        self.latency_s, self.chunk_delay_s = latency, chunk
        return web.json_response({"latency_ms": latency * 1000, "chunk_delay_ms": chunk * 1000})


# -- wire format ----------------------------------------------------------------------
def _abort(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()


async def _write(resp: web.StreamResponse, data: bytes) -> None:
    try:
        await resp.write(data)
    except ConnectionError as exc:
        raise _ClientGone from exc


def _error_response(reply: Reply) -> web.Response:
    headers = {} if reply.retry_after is None else {"Retry-After": str(reply.retry_after)}
    if isinstance(reply.body, str):
        return web.Response(status=reply.status, text=reply.body, headers=headers)
    return web.json_response(reply.body, status=reply.status, headers=headers)


# -- command line ---------------------------------------------------------------------
async def _serve(port: int, latency_ms: float, chunk_delay_ms: float, host: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with FakeOpenAI(host=host, port=port, latency_s=latency_ms / 1000, chunk_delay_s=chunk_delay_ms / 1000) as fake:
        print(f"listening on {fake.base_url}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fake OpenAI-compatible chat-completions server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on start)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay before the first byte of a reply")
    parser.add_argument("--chunk-delay-ms", type=float, default=0.0, help="delay between streamed chunks")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.port, args.latency_ms, args.chunk_delay_ms, args.host))


if __name__ == "__main__":
    main()
