"""What the fake OpenAI server answers, and how it looks on the wire.

``Reply`` and ``Call`` describe one scripted answer (see ``tests.fakes.openai_server``
for the kinds); ``stream_chunks`` and ``completion_body`` render it as the
``chat.completion.chunk`` events or the ``chat.completion`` object OpenAI sends.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    429: "rate_limit_exceeded",
}


@dataclass
class Call:
    """One tool call the fake model makes; ``arguments`` as a dict (JSON-encoded) or a raw string."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def raw_arguments(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass
class Reply:
    """One scripted answer of the fake model (see the module docstring for the kinds).

    Build one with the factories (``Reply.text``, ``Reply.tool_calls``, ``Reply.error``,
    ``Reply.disconnect``, ``Reply.garbage``, ``Reply.stream_error``); the fields hold
    the assistant ``content`` and tool ``calls`` plus timing and fault settings.
    """

    content: str = ""
    calls: list[Call] = field(default_factory=list)
    reasoning: str = ""
    reasoning_field: str = "reasoning_content"
    usage: bool | dict[str, int] = True
    finish_reason: str | None = None
    chunk_chars: int = 4
    omit_tool_index: bool = False
    status: int = 200
    retry_after: float | str | None = None
    body: Any = None
    disconnect_after: int | None = None
    garbage_after: int | None = None
    stream_error_after: int | None = None
    first_byte_delay_s: float | None = None
    chunk_delay_s: float | None = None
    model: str | None = None
    cut_after: int | None = None
    done_after_cut: bool = False
    omit_finish_reason: bool = False
    no_choices: bool = False
    args_as: str = "split"
    raw_body: str | None = None
    content_type: str = "application/json"
    json_when_streamed: bool = False

    @classmethod
    def text(cls, text: str, **kw: Any) -> Reply:
        """A text answer, streamed in ``chunk_chars`` pieces."""
        return cls(content=text, **kw)

    @classmethod
    def tool_calls(cls, calls: Iterable[Call | tuple[str, Any]], text: str = "", **kw: Any) -> Reply:
        """Tool calls (``Call`` or ``(name, arguments)``), optionally after some text."""
        return cls(content=text, calls=[_as_call(c) for c in calls], **kw)

    @classmethod
    def error(
        cls, status: int, *, retry_after: float | str | None = None, body: Any = None, message: str | None = None
    ) -> Reply:
        """An HTTP error status with an OpenAI-style error body (or ``body`` verbatim)."""
        if body is None:
            body = {
                "error": {
                    "message": message or f"fake error {status}",
                    "type": _ERROR_TYPES.get(status, "server_error"),
                    "param": None,
                    "code": None,
                }
            }
        return cls(status=status, retry_after=retry_after, body=body)

    @classmethod
    def disconnect(cls, after_chunks: int = 2, text: str = "this answer is cut off before it ends") -> Reply:
        """Drop the connection after ``after_chunks`` SSE events."""
        return cls(content=text, disconnect_after=after_chunks)

    @classmethod
    def garbage(cls, after_chunks: int = 1, text: str = "this answer turns into garbage") -> Reply:
        """Send an unparsable ``data:`` line after ``after_chunks`` events."""
        return cls(content=text, garbage_after=after_chunks)

    @classmethod
    def stream_error(
        cls, after_chunks: int = 2, text: str = "this answer fails midway", message: str = "The server had an error"
    ) -> Reply:
        """Send an in-stream error event after ``after_chunks`` events (status already 200)."""
        body = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
        return cls(content=text, stream_error_after=after_chunks, body=body)

    @classmethod
    def truncated(cls, after_chunks: int = 3, *, done: bool = False, text: str = "Hello! This is cut", **kw: Any) -> Reply:
        """End the stream cleanly after ``after_chunks`` events, with no finish_reason
        (``done``: still send ``data: [DONE]``, as some proxies do)."""
        return cls(content=text, cut_after=after_chunks, done_after_cut=done, **kw)

    @classmethod
    def raw(cls, body: str, content_type: str = "application/json") -> Reply:
        """A 200 whose body is ``body`` verbatim, whatever was asked for."""
        return cls(raw_body=body, content_type=content_type)

    @classmethod
    def html(cls) -> Reply:
        """A 200 HTML page, as a misrouted proxy or a captive portal sends."""
        return cls.raw("<!DOCTYPE html><html><body><h1>Welcome</h1></body></html>", "text/html")

    @classmethod
    def from_json(cls, data: Any) -> Reply:
        """Build from the control API's JSON (``text``/``tool_calls`` accepted as aliases of
        ``content``/``calls``); raises ValueError naming the bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"a reply must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        if "text" in data:
            data["content"] = data.pop("text")
        if "tool_calls" in data:
            data["calls"] = data.pop("tool_calls")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown reply field(s): {', '.join(unknown)}")
        calls = data.pop("calls", [])
        if not isinstance(calls, list):
            raise ValueError("tool_calls must be a list")
        parsed: list[Call] = []
        for c in calls:
            if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                raise ValueError("each tool call needs a string 'name'")
            args = c.get("arguments", {})
            if not isinstance(args, dict | str):
                raise ValueError("tool call 'arguments' must be an object or a string")
            parsed.append(Call(name=c["name"], arguments=args, id=c.get("id")))
        if data.get("args_as", "split") not in ARGS_SHAPES:
            raise ValueError(f"args_as must be one of {', '.join(ARGS_SHAPES)}")
        for name, value in data.items():
            expected = _FIELD_TYPES.get(name)
            if expected is not None and value is not None and (
                not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected)
            ):
                raise ValueError(f"reply field {name!r} has the wrong type ({type(value).__name__})")
        return cls(calls=parsed, **data)


ARGS_SHAPES = ("split", "whole", "object")
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "content": (str,), "reasoning": (str,), "reasoning_field": (str,), "finish_reason": (str,), "model": (str,),
    "usage": (bool, dict), "chunk_chars": (int,), "omit_tool_index": (bool,), "status": (int,),
    "retry_after": (int, float, str), "disconnect_after": (int,), "garbage_after": (int,),
    "stream_error_after": (int,), "first_byte_delay_s": (int, float), "chunk_delay_s": (int, float),
    "cut_after": (int,), "done_after_cut": (bool,), "omit_finish_reason": (bool,), "no_choices": (bool,),
    "args_as": (str,), "raw_body": (str,), "content_type": (str,), "json_when_streamed": (bool,),
}


def _as_call(c: Call | tuple[str, Any]) -> Call:
    if isinstance(c, Call):
        return c
    name, args = c
    return Call(name=name, arguments=args)


def _pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _usage(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    if isinstance(reply.usage, dict):
        given: dict[str, Any] = dict(reply.usage)
        given.setdefault("total_tokens", given.get("prompt_tokens", 0) + given.get("completion_tokens", 0))
        return given
    prompt = max(1, len(json.dumps(body.get("messages", []))) // 4)
    produced = len(reply.content) + len(reply.reasoning) + sum(len(c.name) + len(c.raw_arguments()) for c in reply.calls)
    completion = max(1, produced // 4)
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if reply.reasoning:
        usage["completion_tokens_details"] = {"reasoning_tokens": max(1, len(reply.reasoning) // 4)}
    return usage


def _finish_reason(reply: Reply) -> str:
    return reply.finish_reason or ("tool_calls" if reply.calls else "stop")


def _call_ids(reply: Reply) -> list[str]:
    return [c.id or f"call_{uuid.uuid4().hex[:24]}" for c in reply.calls]


def _envelope(body: dict[str, Any], reply: Reply, kind: str) -> dict[str, Any]:
    """The fields every completion object and chunk carries."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": kind,
        "created": int(time.time()),
        "model": reply.model or body.get("model") or "fake",
        "system_fingerprint": "fp_fake",
    }


def stream_chunks(body: dict[str, Any], reply: Reply) -> Iterable[dict[str, Any]]:
    """Every chat.completion.chunk of a streamed reply, in the order OpenAI sends them."""
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    base = _envelope(body, reply, "chat.completion.chunk")

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choices = [] if reply.no_choices else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        out = dict(base, choices=choices)
        if include_usage:
            out["usage"] = None
        return out

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    for piece in _pieces(reply.reasoning, reply.chunk_chars):
        yield chunk({reply.reasoning_field: piece})
    for piece in _pieces(reply.content, reply.chunk_chars):
        yield chunk({"content": piece})
    for index, (call, call_id) in enumerate(zip(reply.calls, _call_ids(reply), strict=True)):
        for delta in _call_deltas(reply, index, call, call_id):
            yield chunk({"tool_calls": [delta]})
    yield chunk({}, None if reply.omit_finish_reason else _finish_reason(reply))
    if include_usage and reply.usage is not False:
        yield dict(base, choices=[], usage=_usage(body, reply))


def _call_deltas(reply: Reply, index: int, call: Call, call_id: str) -> Iterable[dict[str, Any]]:
    """One call's tool-call deltas: the name, then the arguments split in pieces
    (``args_as="split"``), or all of it in one delta with the arguments as one string
    (``"whole"``) or as a JSON object (``"object"``, which some compatible servers send)."""
    head: dict[str, Any] = {"index": index, "id": call_id, "type": "function", "function": {"name": call.name}}
    parts: list[dict[str, Any]] = [head]
    if reply.args_as == "object":
        head["function"]["arguments"] = json.loads(call.raw_arguments())
    elif reply.args_as == "whole":
        head["function"]["arguments"] = call.raw_arguments()
    else:
        head["function"]["arguments"] = ""
        parts += [{"index": index, "function": {"arguments": piece}}
                  for piece in _pieces(call.raw_arguments(), reply.chunk_chars)]
    if reply.omit_tool_index:
        for part in parts:
            del part["index"]
    return parts


def completion_body(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    """A non-streaming chat.completion object."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None, "refusal": None}
    if reply.calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": c.name, "arguments": c.raw_arguments()}}
            for c, call_id in zip(reply.calls, _call_ids(reply), strict=True)
        ]
    if reply.reasoning:
        message[reply.reasoning_field] = reply.reasoning
    out = _envelope(body, reply, "chat.completion")
    out["choices"] = [{"index": 0, "message": message, "logprobs": None, "finish_reason": _finish_reason(reply)}]
    if reply.usage is not False:
        out["usage"] = _usage(body, reply)
    return out
