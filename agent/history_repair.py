"""Make a stored history valid for the chat API again: every call answered once, no strays.

Histories get cut (turn limits, compaction, a crash between the call and its
result) and some providers reuse tool-call ids. The API rejects a tool result
without its call, a call without a result, and duplicate ids, so before each LLM
call the history goes through :func:`repair_pairing` (the "History repair" rules
of the shared cases README).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Final

from agent.types import Message, ToolCall

MISSING_RESULT: Final[str] = "[Tool result missing — session was compacted]"


def _unique_id(call_id: str, used: set[str]) -> str:
    """``<id>_dedup_<n>`` with the smallest ``n`` from 1 that is not taken yet."""
    n = 1
    while f"{call_id}_dedup_{n}" in used:
        n += 1
    return f"{call_id}_dedup_{n}"


def _fresh_id(used: set[str]) -> str:
    """``call_<n>`` for a call that came without an id (the API needs one to pair results)."""
    n = 1
    while f"call_{n}" in used:
        n += 1
    return f"call_{n}"


def repair_pairing(messages: Sequence[Message]) -> list[Message]:
    """Drop orphan and extra tool results, synthesize missing ones, rename reused call ids.

    A call without an id gets ``call_<n>`` (smallest free ``n``); results never pair
    with an empty id, so such a call gets a synthesized result.

    The input is not modified; messages that need no change are passed through as they are.
    """
    out: list[Message] = []
    used: set[str] = set()
    i = 0
    total = len(messages)
    while i < total:
        message = messages[i]
        i += 1
        if message.role == "tool":
            continue  # not directly after the assistant message that made the call
        if message.role != "assistant" or not message.tool_calls:
            out.append(message)
            continue

        calls: list[ToolCall] = []
        renamed = False
        for call in message.tool_calls:
            new_id = call.id
            if not call.id:
                new_id = _fresh_id(used)
                renamed = True
            elif call.id in used:
                new_id = _unique_id(call.id, used)
                renamed = True
            used.add(new_id)
            calls.append(call if new_id == call.id else call.model_copy(update={"id": new_id}))
        out.append(message.model_copy(update={"tool_calls": calls}) if renamed else message)

        # The run of tool messages right after this one; each result pairs with the first
        # call (in call order) that has the same original id and no result yet.
        waiting: dict[str, deque[int]] = {}
        for index, original in enumerate(message.tool_calls):
            waiting.setdefault(original.id, deque()).append(index)
        answered = [False] * len(calls)
        while i < total and messages[i].role == "tool":
            result = messages[i]
            i += 1
            slots = waiting.get(result.tool_call_id) if result.tool_call_id else None
            if not slots:
                continue  # unknown id, empty id, or an extra result for an answered call
            index = slots.popleft()
            answered[index] = True
            final_id = calls[index].id
            out.append(
                result
                if final_id == result.tool_call_id
                else result.model_copy(update={"tool_call_id": final_id})
            )
        for index, call in enumerate(calls):
            if not answered[index]:
                out.append(Message.tool(call.id, MISSING_RESULT, is_error=True))
    return out
