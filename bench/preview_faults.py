"""Replies under failing preview edits, the same way for every chat platform.

Each reply streams a few previews into its own chat and then delivers a multi-part
answer through the channel's real ``ReplyStream``; ``concurrency`` replies run at
once. Afterwards every chat is read back from the fake: a reply counts as complete
and once when the chat shows exactly the answer's parts, in order, and nothing else
(no stale preview, no duplicate). The run is repeated with no faults and with a share
of the preview edits failing in mixed ways, to give the extra API calls per reply and
the reply times next to each other. ``slack_faults`` and ``telegram_faults`` are the two
platforms' runs, called by ``bench/slack.py`` and ``bench/telegram.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from bench.common import summary_ms
from channels.base import ReplyStream, Target

PREVIEWS_PER_REPLY = 4
PREVIEW_INTERVAL_S = 0.05
FIRST_TELEGRAM_CHAT = 700_000
# A Markdown answer with what the formatters treat specially (headings, links, code, lists).
REPLY_UNIT = (
    "## Result\n\nThe deploy went out at **nine**; error rates stayed _flat_. See [the runbook]"
    "(https://example.com/runbook?a=1&b=2) and `kubectl get pods`.\n\n"
    "- first point with <angle> & ampersand\n- second point\n\n"
    "```python\nfor pod in pods:\n    if pod.ready < 1:\n        restart(pod)\n```\n\n"
)


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


# ---- the two platforms -------------------------------------------------------------------


async def slack_faults(client: aioredis.Redis, replies: int, rate: float) -> dict[str, Any]:
    """Slack: the replies without faults, then with ``rate`` of ``chat.update`` failing."""
    # Each platform's SDK is imported by its own part only: bench/telegram.py, on the path
    # of a script in bench/, would stand in for the python-telegram-bot package.
    from channels.slack import SlackChannel, SlackSettings
    from channels.slack.format import format_parts as slack_parts
    from tests.fakes.slack_context import RecordingContext, RedisKeyValue
    from tests.fakes.slack_server import FakeSlack

    async def run(fault_rate: float) -> dict[str, Any]:
        async with FakeSlack() as fake:
            ctx = RecordingContext(RedisKeyValue(client, f"bench-faults-{fault_rate}"))
            settings = SlackSettings(bot_token=fake.bot_token, signing_secret="x", mode="http",
                                     api_base_url=fake.api_url, preview_interval_s=PREVIEW_INTERVAL_S,
                                     api_timeout_s=1.0)
            channel = SlackChannel(settings)
            await channel.start(ctx.ctx)
            if fault_rate:
                fake.chaos("chat.update", fault_rate, seed=14, hang_s=1.5)
            platform = Platform(
                open_stream=lambda n: channel.open_stream(
                    Target(channel="slack", chat_id=f"CF{n}", reply_to=f"9.{n}"), f"bench-run-{n}"),
                chat_shows=lambda n: _slack_conversation(fake, f"CF{n}"),
                api_calls=lambda n: sum(
                    1 for c in fake.calls if c.args.get("channel") == f"CF{n}" and not c.method.startswith("reactions.")),
                preview_gap_s=PREVIEW_INTERVAL_S * 1.5,
            )
            try:
                return await _replies(platform, slack_parts(REPLY_UNIT * 60), replies)
            finally:
                await channel.stop()

    return await _clean_then_faulty(run, rate)


async def telegram_faults(client: aioredis.Redis, replies: int, rate: float) -> dict[str, Any]:
    """Telegram: the replies without faults, then with ``rate`` of ``editMessageText`` failing."""
    from agent.types import TelegramChat
    from tests.fakes.telegram_context import TelegramHarness

    async def run(fault_rate: float) -> dict[str, Any]:
        async with TelegramHarness(client, f"bench-faults-{fault_rate}") as h:
            channel = await h.channel(stream_edit_interval_s=PREVIEW_INTERVAL_S,
                                      tuning={"preview_timeout_s": 1.0, "send_backoff_s": 0.05})
            if fault_rate:
                h.fake.chaos("editMessageText", fault_rate, seed=14, hang_s=1.5)
            platform = Platform(
                open_stream=lambda n: channel.open_stream(
                    Target(channel="telegram", chat_id=str(FIRST_TELEGRAM_CHAT + n),
                           chat=TelegramChat(chat_type="private")), f"bench-run-{n}"),
                chat_shows=lambda n: [m.raw for m in h.fake.sent_messages(FIRST_TELEGRAM_CHAT + n)],
                api_calls=lambda n: _telegram_calls(h.fake, FIRST_TELEGRAM_CHAT + n),
                preview_gap_s=PREVIEW_INTERVAL_S * 1.5,
            )
            return await _replies(platform, channel.format_parts(REPLY_UNIT * 20), replies)

    return await _clean_then_faulty(run, rate)


async def _clean_then_faulty(run: Callable[[float], Awaitable[dict[str, Any]]], rate: float) -> dict[str, Any]:
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # the fakes' dropped connections
    clean = await run(0.0)
    return compare(clean, await run(rate), rate)


async def _replies(platform: Platform, parts: list[str], replies: int) -> dict[str, Any]:
    """One reply at a time (reply times without CPU contention between replies), each
    previewing a growing two-unit text before its parts."""
    text = REPLY_UNIT * 2
    previews = [text[: len(text) * k // PREVIEWS_PER_REPLY] for k in range(1, PREVIEWS_PER_REPLY + 1)]
    return await run_replies(platform, parts, previews, replies, concurrency=1, settle=lambda: asyncio.sleep(2.0))


def _slack_conversation(fake: Any, channel: str) -> list[str]:
    return [str(m.get("text") or "") for (ch, _), m in sorted(fake.messages.items(), key=lambda kv: float(kv[0][1]))
            if ch == channel]


def _telegram_calls(fake: Any, chat_id: int) -> int:
    return sum(1 for c in fake.calls if c.method != "sendChatAction" and c.params.get("chat_id") == chat_id)
