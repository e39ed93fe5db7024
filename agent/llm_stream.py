"""Assembling a streamed chat completion into text, reasoning and tool calls.

Providers differ in small ways: tool-call deltas usually carry an ``index`` but some
omit it (a delta without one continues the last call unless it brings a new id),
some restart the index for every call, some send each call whole in one delta, some
send ``arguments`` as a JSON object rather than a string, some reuse call ids, and
reasoning arrives under different names (``reasoning_content``, ``reasoning``,
``thinking``, …) as extra fields of the delta, as a string or a ``{"text": …}`` object.
This module absorbs those differences so the client and the loop see one shape. It
also reads the SSE events from the body bytes itself, which is several times cheaper
than the SDK's model per chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson

from agent.llm_types import LLMError, LLMResponse, StreamDelta, estimate_text_tokens, estimate_tokens
from agent.types import Message, ToolCall, Usage

# Checked in this order; only the first non-empty one of a delta is used, because some
# servers send the same text under two names.
REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking", "reasoning_text")

_DRAIN_S = 0.1


@dataclass
class _CallParts:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class StreamAssembler:
    """Feed it chunks (``openai`` ChatCompletionChunk objects or plain dicts); read ``response()``."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[_CallParts] = []
        self._by_index: dict[int, _CallParts] = {}
        self._usage: Any = None
        self.finish_reason: str | None = None
        self.model = ""
        self.chunks = 0
        # True once visible text has been handed out: a retry would then show a second answer.
        self.started = False

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    def feed(self, chunk: Any) -> list[StreamDelta]:
        """Take one chunk; return the visible deltas it carried, in order."""
        self.chunks += 1
        get = chunk.get if type(chunk) is dict else partial(_get, chunk)  # dicts: the raw stream
        self.model = get("model") or self.model
        usage = get("usage")
        if usage is not None:
            self._usage = usage
        deltas: list[StreamDelta] = []
        for choice in _list_of(get("choices")):
            field_of = choice.get if type(choice) is dict else partial(_get, choice)
            if (field_of("index") or 0) != 0:
                continue
            finish = field_of("finish_reason")
            if finish:
                self.finish_reason = str(finish)
            delta = field_of("delta")
            if delta is None or (type(delta) is dict and self._feed_plain(delta, deltas)):
                continue
            reasoning = _reasoning_of(delta)
            if reasoning:
                self._reasoning.append(reasoning)
                deltas.append(StreamDelta("reasoning", reasoning))
            for key in ("content", "refusal"):
                piece = _text_of(_get(delta, key))
                if piece:
                    self._text.append(piece)
                    self.started = True
                    deltas.append(StreamDelta("text", piece))
            for call_delta in _list_of(_get(delta, "tool_calls")):
                self._feed_call(call_delta)
        return deltas

    def _feed_plain(self, delta: dict[str, Any], deltas: list[StreamDelta]) -> bool:
        """The common delta, at most a role and a text ``content`` (other fields None): taken
        here in one pass, True. Anything else is left to the tolerant path, False."""
        content = None
        for key, value in delta.items():
            if value is None or key == "role":
                continue
            if key != "content" or type(value) is not str:
                return False
            content = value
        if content:
            self._text.append(content)
            self.started = True
            deltas.append(StreamDelta("text", content))
        return True

    def _feed_call(self, delta: Any) -> None:
        index = _get(delta, "index")
        call_id = _get(delta, "id") or ""
        function = _get(delta, "function")
        name = _get(function, "name") if function is not None else None
        name = name if isinstance(name, str) else ""
        arguments = _arguments_text(_get(function, "arguments") if function is not None else None)
        parts = self._target(index if isinstance(index, int) else None, call_id, name, arguments)
        if call_id and not parts.id:
            parts.id = call_id
        if name and name != parts.name:
            parts.name = name if not parts.name else parts.name + name
        if arguments:
            parts.arguments.append(arguments)

    def _target(self, index: int | None, call_id: str, name: str, arguments: str) -> _CallParts:
        """The call a delta belongs to, starting a new one where the delta says so: a
        different id, or a name arriving after the call's arguments were already whole."""
        known = (self._calls[-1] if self._calls else None) if index is None else self._by_index.get(index)
        same_id = not (call_id and known is not None and known.id and call_id != known.id)
        if known is not None and same_id and not _starts_another(known, name, arguments):
            return known
        parts = _CallParts()
        self._calls.append(parts)
        if index is not None:
            self._by_index[index] = parts
        return parts

    def tool_calls(self, taken: set[str] | None = None) -> list[ToolCall]:
        """The finished calls. A call without an id, or with one already used (in this
        answer or in ``taken``), gets a fresh one so every result pairs with one call."""
        used = set(taken or ())
        out: list[ToolCall] = []
        for parts in self._calls:
            arguments = "".join(parts.arguments)
            if not parts.name and not arguments:
                continue
            call_id = parts.id if parts.id and parts.id not in used else f"call_{uuid.uuid4().hex[:24]}"
            used.add(call_id)
            out.append(ToolCall(id=call_id, name=parts.name, arguments=arguments))
        return out

    @property
    def answered(self) -> bool:
        """Whether anything usable came: text or a tool call (reasoning alone is no answer)."""
        return bool(self.text.strip()) or any(p.name or p.arguments for p in self._calls)

    def usage(self, prompt: Sequence[Message]) -> Usage:
        """The API's usage when it sent one, else the estimate (4 chars/token + 16/message)."""
        prompt_tokens = _get(self._usage, "prompt_tokens") if self._usage is not None else None
        completion_tokens = _get(self._usage, "completion_tokens") if self._usage is not None else None
        if isinstance(prompt_tokens, int) and isinstance(completion_tokens, int):
            return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        produced = self.text + self.reasoning + "".join(c.name + c.arguments for c in self.tool_calls())
        return Usage(
            prompt_tokens=estimate_tokens(prompt), completion_tokens=estimate_text_tokens(produced), estimated=True
        )

    def response(self, prompt: Sequence[Message], *, attempts: int = 1) -> LLMResponse:
        taken = {c.id for m in prompt for c in m.tool_calls or ()}
        return LLMResponse(
            text=self.text,
            reasoning=self.reasoning,
            tool_calls=self.tool_calls(taken),
            usage=self.usage(prompt),
            finish_reason=self.finish_reason,
            model=self.model,
            attempts=attempts,
        )


def _get(obj: Any, key: str) -> Any:
    """A field of a dict or of an ``openai`` model (missing fields read as None)."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(key)
    value = getattr(obj, key, None)
    if value is None:
        extra = getattr(obj, "model_extra", None)
        if isinstance(extra, dict):
            value = extra.get(key)
    return value


def _list_of(value: Any) -> list[Any]:
    """``value`` if it is a list, else nothing (a junk field never breaks the stream)."""
    return value if isinstance(value, list) else []


def _reasoning_of(delta: Any) -> str:
    for key in REASONING_FIELDS:
        value = _text_of(_get(delta, key))
        if value:
            return value
    return ""


def _text_of(value: Any) -> str:
    """Text from a string, a ``{"text"|"content": …}`` object, or a list of such parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        inner = value.get("text", value.get("content"))
        return inner if isinstance(inner, str) else ""
    if isinstance(value, list):
        return "".join(_text_of(part) for part in value)
    return ""


def _arguments_text(value: Any) -> str:
    """Tool-call arguments as the JSON string the history keeps; some servers send an object."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return ""


def _starts_another(parts: _CallParts, name: str, arguments: str) -> bool:
    """A named delta after a call whose arguments already form a whole JSON value is the
    next call (servers that send calls whole, without index or with a reused id);
    a repeated name with no arguments, or argument pieces, continue the call."""
    if not name or not parts.name or not parts.arguments or (name == parts.name and not arguments):
        return False
    last = next((p for p in reversed(parts.arguments) if p.strip()), "")
    if not last.rstrip().endswith(("}", "]")):  # cheap: most pieces cannot end a JSON value
        return False
    try:
        json.loads("".join(parts.arguments))
    except (ValueError, RecursionError):
        return False
    return True


class SSEDecoder:
    """Server-sent events from the raw body bytes, decoded the way the ``openai`` SDK
    decodes them (lines end in CR, LF or CRLF; ``data`` lines join with newlines; a blank
    line ends an event; ``id`` persists as the spec says), without an object per event.
    ``feed`` returns ``(event name, data)`` pairs; invalid UTF-8 raises ``ValueError``."""

    def __init__(self) -> None:
        self._tail = b""
        self._event: str | None = None
        self._data: list[str] = []
        self._last_id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        buf = self._tail + chunk if self._tail else chunk
        # A CR at the very end may be the first half of a CRLF: keep it for the next chunk.
        cut = max(buf.rfind(b"\n"), buf.rfind(b"\r", 0, len(buf) - 1))
        if cut < 0:
            self._tail = buf
            return []
        self._tail = buf[cut + 1 :]
        events: list[tuple[str | None, str]] = []
        for line in buf[: cut + 1].splitlines():
            if not line:
                if self._event or self._data or self._last_id or self._retry is not None:
                    events.append((self._event, "\n".join(self._data)))
                    self._event, self._data, self._retry = None, [], None
                continue
            if line[:1] == b":":
                continue
            name, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                self._data.append(value.decode("utf-8"))
            elif name == b"event":
                self._event = value.decode("utf-8")
            elif name == b"id":
                if b"\0" not in value:
                    self._last_id = value.decode("utf-8")
            elif name == b"retry":
                with contextlib.suppress(ValueError):
                    self._retry = int(value)
        return events


def encode_json(request: dict[str, Any] | list[Any]) -> bytes:
    """JSON as a request body carries it: orjson (several times the stdlib's speed on a
    long prompt), the stdlib for what orjson refuses (an integer past 64 bits in a tool's
    schema)."""
    try:
        return orjson.dumps(request)
    except TypeError:
        return json.dumps(request, ensure_ascii=False).encode()


def decode_json(data: str) -> Any:
    """One SSE event's JSON; the stdlib for what orjson refuses (NaN, huge integers)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)  # raises ValueError when it is not JSON at all


async def drain(body: AsyncIterator[bytes]) -> None:
    """Read what follows ``[DONE]`` (briefly) so the connection can be reused."""
    with contextlib.suppress(TimeoutError, LLMError):
        async with asyncio.timeout(_DRAIN_S):
            async for _ in body:
                pass


def malformed(assembler: StreamAssembler) -> LLMError:
    return LLMError(
        "The language model sent a malformed stream (an event that is not JSON).",
        kind="protocol", retryable=True, started=assembler.started,
    )


def check_finished(assembler: StreamAssembler, content_type: str) -> None:
    """Raise unless the stream was a whole answer: a finish reason, and something in it."""
    if assembler.finish_reason is None:
        if not assembler.answered:
            raise LLMError(
                f"The language model sent no answer ({assembler.chunks} events, content type "
                f"{content_type or 'none'!r}, no finish_reason).",
                kind="empty", retryable=True, started=assembler.started,
            )
        raise LLMError(
            f"The language model stream ended without a finish_reason after {assembler.chunks} events (cut off).",
            kind="incomplete", retryable=True, started=assembler.started,
        )
    if not assembler.answered and assembler.finish_reason not in ("length", "content_filter"):
        raise LLMError(
            f"The language model finished ({assembler.finish_reason!r}) with no text and no tool call.",
            kind="empty", retryable=True, started=assembler.started,
        )
