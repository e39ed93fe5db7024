"""Replies under failing preview edits, the same way for every chat platform.

Each reply streams a few previews into its own chat and then delivers a multi-part
answer through the channel's real ``ReplyStream``; ``concurrency`` replies run at
once. Afterwards every chat is read back from the fake: a reply counts as complete
and once when the chat shows exactly the answer's parts, in order, and nothing else
(no stale preview, no duplicate). The run is repeated with no faults and with a share
of the preview edits failing in mixed ways, to give the extra API calls per reply and
the reply times next to each other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench.common import summary_ms
from channels.base import ReplyStream

PREVIEWS_PER_REPLY = 4


@dataclass
class Platform:
    """What the driver needs from one platform's channel and fake."""

    open_stream: Callable[[int], ReplyStream]  # reply number -> a stream into that reply's own chat
    chat_shows: Callable[[int], list[str]]  # what the reply's chat shows now, oldest first
    api_calls: Callable[[int], int]  # calls made for the reply's chat so far (typing/reactions excluded)
    preview_gap_s: float  # a little more than the channel's preview interval


async def run_replies(
    platform: Platform, parts: list[str], previews: list[str], replies: int, concurrency: int,
    settle: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Run ``replies`` replies; return complete/once count, API calls per reply and timings."""
    slots = asyncio.Semaphore(concurrency)
    durations: list[float] = []

    async def one(n: int) -> None:
        async with slots:
            started = time.perf_counter()
            stream = platform.open_stream(n)
            await stream.start()
            for text in previews:
                await stream.preview(text)
                await asyncio.sleep(platform.preview_gap_s)
            for index, part in enumerate(parts):
                await stream.deliver(index, part)
            await stream.close()
            durations.append(time.perf_counter() - started)

    started = time.perf_counter()
    outcomes = await asyncio.gather(*(one(n) for n in range(replies)), return_exceptions=True)
    wall = time.perf_counter() - started
    if settle is not None:
        await settle()
    errors = [repr(o) for o in outcomes if isinstance(o, BaseException)]
    complete = sum(1 for n in range(replies) if platform.chat_shows(n) == parts)
    calls = [platform.api_calls(n) for n in range(replies)]
    return {
        "replies": replies,
        "complete_once": complete,
        "raised": len(errors),
        "first_error": errors[0] if errors else None,
        "api_calls_per_reply": round(sum(calls) / replies, 2),
        "reply": summary_ms(durations),
        "wall_s": round(wall, 2),
    }


def compare(clean: dict[str, Any], faulty: dict[str, Any], rate: float) -> dict[str, Any]:
    return {
        "fault_rate": rate,
        "no_faults": clean,
        "with_faults": faulty,
        "extra_api_calls_per_reply": round(faulty["api_calls_per_reply"] - clean["api_calls_per_reply"], 2),
    }


def rows(result: dict[str, Any]) -> list[list[Any]]:
    """Table rows: run, complete/once, API calls per reply, p50 and p99 reply ms."""
    out = []
    for label, key in (("no faults", "no_faults"), (f"{result['fault_rate']:.0%} edits failing", "with_faults")):
        run = result[key]
        out.append([label, f"{run['complete_once']}/{run['replies']}", run["api_calls_per_reply"],
                    run["reply"]["p50_ms"], run["reply"]["p99_ms"]])
    return out
