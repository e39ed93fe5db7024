"""The fleet of ``bench/replicas.py``: the chats' markers, the fake Slack that sees the
answers arrive, the ``botd run`` replicas' config, readiness and logs, and what the
fake model was asked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import FakeLLM
from tests.e2e.botd_process import BotdProcess
from tests.e2e.chat_rig import EVENTS_PATH
from tests.fakes.slack_server import FakeSlack

# Fixed width, so a preview cut inside a marker never matches a whole one.
MARK = re.compile(r"\bmk\d{5}x\d{3}\b")
WARMUP_BASE = 90000  # session numbers of the warm-up chats


def mark_of(session: int, message: int) -> str:
    return f"mk{session:05d}x{message:03d}"


def user_of(session: int) -> str:
    return f"UB{session:05d}"


def message_text(session: int, message: int) -> str:
    # The marker comes last: a bot message holding it holds the whole echoed answer.
    return f"ss{session:05d} message {message} please confirm {mark_of(session, message)}"


class MarkWatch:
    """Resolves a future with ``time.monotonic()`` when a bot message first holds a
    marker (a preview that already shows the whole answer counts, since that is when
    the user sees it). Mixed into a fake platform, whose send and edit methods call
    ``seen``. CLOCK_MONOTONIC is system-wide, so the times compare across processes."""

    waiting: dict[str, asyncio.Future[float]]

    def expect(self, mark: str) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[mark] = fut
        return fut

    def seen(self, text: str) -> None:
        now = time.monotonic()
        for mark in MARK.findall(text):
            fut = self.waiting.pop(mark, None)
            if fut is not None and not fut.done():
                fut.set_result(now)


class WatchedSlack(MarkWatch, FakeSlack):
    """The fake Slack, watching ``chat.postMessage`` and ``chat.update`` for markers."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.waiting = {}

    def _seen(self, args: dict[str, Any], result: dict[str, Any]) -> None:
        if result.get("ok"):
            self.seen(str(args.get("text") or ""))

    def _m_chat_postMessage(self, args: dict[str, Any]) -> dict[str, Any]:
        result = super()._m_chat_postMessage(args)
        self._seen(args, result)
        return result

    def _m_chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        result = super()._m_chat_update(args)
        self._seen(args, result)
        return result

    def answers_per_mark(self) -> Counter[str]:
        """Bot messages (as they stand now) holding each marker."""
        counts: Counter[str] = Counter()
        for message in self.messages.values():
            if message.get("user") == self.bot_user_id:
                counts.update(set(MARK.findall(str(message.get("text") or ""))))
        return counts


# ---- the replicas -------------------------------------------------------------------


def replica_config(
    workspace: Path, port: int, llm: FakeLLM, slack: FakeSlack, redis_url: str, prefix: str,
    users: list[str], args: argparse.Namespace,
) -> dict[str, Any]:
    return {
        "agent": {"workspace": str(workspace)},
        "llm": {"base_url": llm.base_url, "api_key": "bench-key", "request_timeout_s": 120},
        "redis": {"url": redis_url, "prefix": prefix},
        "http": {"port": port},
        "queue": {"debounce_ms": 0},
        "gateway": {"max_concurrent_runs": args.max_concurrent_runs, "shutdown_grace_s": 10},
        "log": {"level": args.log_level},
        "telegram": {"enabled": False},
        "slack": {
            "enabled": True,
            "mode": "http",
            "bot_token": slack.bot_token,
            "signing_secret": slack.signing_secret,
            "api_base_url": slack.api_url,
            "events_path": EVENTS_PATH,
            "allow_from": users,
        },
    }


async def wait_ready(bot: BotdProcess, within_s: float = 60.0) -> None:
    await bot.wait_healthy(within_s)
    deadline = time.monotonic() + within_s
    while True:
        status, body = await bot.get("/readyz")
        if status == 200:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{bot.url} not ready: {body}\n{bot.log()[-3000:]}")
        await asyncio.sleep(0.1)


def log_summary(bot: BotdProcess, since: int) -> dict[str, Any]:
    """Runs finished, and warning/error events, in a replica's JSON log after offset ``since``."""
    runs = 0
    trouble: Counter[str] = Counter()
    with bot.log_path.open("rb") as f:
        f.seek(since)
        for raw in f:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            name = str(event.get("event", ""))
            if name == "run.finished":
                runs += 1
            if event.get("level") in ("warning", "error", "critical") or name in ("run.resuming", "run.cancelling"):
                trouble[f"{name}:{event['reason']}" if "reason" in event else name] += 1
    return {"runs": runs, "log_events": dict(sorted(trouble.items()))}



# ---- the fake model's record ----------------------------------------------------------


def unanswered_marks(body: dict[str, Any]) -> list[str]:
    """The markers of the user messages after the last assistant message of a request."""
    marks: list[str] = []
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            marks = []
        elif message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            marks += MARK.findall(str(content or ""))
    return marks



async def llm_requests(http: aiohttp.ClientSession, llm: FakeLLM) -> list[dict[str, Any]]:
    async with http.get(f"{llm.root}/_fake/requests") as resp:
        resp.raise_for_status()
        return list((await resp.json())["requests"])


async def llm_reset(http: aiohttp.ClientSession, llm: FakeLLM) -> None:
    async with http.post(f"{llm.root}/_fake/reset") as resp:
        resp.raise_for_status()

