"""A whole daemon in the test process, for gateway integration tests.

``running_daemon`` builds a :class:`BotdConfig` for one test (workspace under
``tmp_path``, the fake OpenAI server as the LLM, the test Redis under the test's own
prefix, short lock TTL and grace) and starts :class:`bot.daemon.Daemon` with the
in-process :class:`RecordingChannel` as its only channel (``RunRequest.channel ==
"test"``); no HTTP server, no scheduler. Every other piece is the real one: the real
gateway, locks, inbox, agent loop, tools and ``openai`` client.

    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        fake.script(Reply.text("hello"))
        await bot.send("hi")
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from agent.types import Message, RunRequest
from bot.app import App
from bot.config import BotdConfig
from bot.daemon import Daemon
from bot.gateway.gateway import Gateway
from bot.session_keys import session_key
from bot.store.keys import Keys
from bot.store.sessions import SessionStore
from channels.base import SubmitResult
from tests.fakes.openai_server import FakeOpenAI, Reply, echo_last_user
from tests.fakes.recording_channel import RecordingChannel

AGENT_ID = "main"
CHANNEL = "test"
DEFAULT_CHAT = "100"


def make_config(
    tmp_path: Path,
    fake: FakeOpenAI,
    redis_url: str,
    redis_prefix: str,
    *,
    workspace: str = "workspace",
    **sections: dict[str, Any],
) -> BotdConfig:
    """A config for one test; ``sections`` override keys per section, e.g.
    ``queue={"mode": "followup"}``."""
    data: dict[str, dict[str, Any]] = {
        # One shared directory: these tests look at the files tools leave in the workspace
        # (per-session directories are tested with the sandbox in tests/security).
        "agent": {"id": AGENT_ID, "workspace": str(tmp_path / workspace), "max_iterations": 5,
                  "workspace_scope": "shared"},
        "llm": {
            "base_url": fake.base_url,
            "api_key": "test-key",
            "max_retries": 1,
            "request_timeout_s": 30,
        },
        "redis": {"url": redis_url, "prefix": redis_prefix},
        "queue": {"mode": "steer", "cap": 20, "debounce_ms": 0},
        "gateway": {"lock_ttl_s": 3, "shutdown_grace_s": 2, "approval_timeout_s": 5, "run_timeout_s": 60},
        "guard": {"action": "warn"},
        "security": {"tool_timeout_s": 30},
        "telegram": {"enabled": False},
        "slack": {"enabled": False},
        "heartbeat": {"enabled": False},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return BotdConfig.model_validate(data)


def chat_request(
    text: str,
    *,
    chat_id: str = DEFAULT_CHAT,
    user_id: str | None = None,
    dedupe_key: str | None = None,
) -> RunRequest:
    """A DM from the user ``chat_id`` in the test channel."""
    return RunRequest(
        session_key=dm_session(chat_id),
        agent_id=AGENT_ID,
        channel=CHANNEL,
        chat_id=chat_id,
        user_id=user_id or chat_id,
        user_name="Tester",
        text=text,
        dedupe_key=dedupe_key,
    )


def dm_session(chat_id: str = DEFAULT_CHAT) -> str:
    return session_key(AGENT_ID, CHANNEL, "dm", chat_id)


@dataclass
class Bot:
    """One running daemon and what tests poke at."""

    daemon: Daemon
    channel: RecordingChannel
    cfg: BotdConfig
    stopped: bool = False

    @property
    def app(self) -> App:
        assert self.daemon.app is not None
        return self.daemon.app

    @property
    def gateway(self) -> Gateway:
        return self.app.gateway

    @property
    def sessions(self) -> SessionStore:
        return self.app.sessions

    @property
    def redis(self) -> aioredis.Redis:
        assert self.daemon.store is not None
        return self.daemon.store.client

    @property
    def keys(self) -> Keys:
        return Keys(self.cfg.redis.prefix)

    async def send(
        self, text: str, *, chat_id: str = DEFAULT_CHAT, dedupe_key: str | None = None
    ) -> SubmitResult:
        return await self.gateway.submit(chat_request(text, chat_id=chat_id, dedupe_key=dedupe_key))

    async def submit(self, req: RunRequest) -> SubmitResult:
        return await self.gateway.submit(req)

    async def history(self, chat_id: str = DEFAULT_CHAT) -> list[Message]:
        return await self.sessions.history(dm_session(chat_id))

    async def queued(self, chat_id: str = DEFAULT_CHAT) -> tuple[int, int]:
        """(waiting in the inbox, taken but not finished) for a DM session."""
        prefix, sk = self.cfg.redis.prefix, dm_session(chat_id)
        return (
            int(await self.redis.llen(f"{prefix}:inbox:{sk}")),
            int(await self.redis.llen(f"{prefix}:running:{sk}")),
        )

    async def wait_idle(self, chat_id: str = DEFAULT_CHAT, timeout: float = 10.0) -> None:
        """Wait until the session has no queued or running work and nobody holds its lock."""
        sk = dm_session(chat_id)
        await wait_until(lambda: self._idle(sk), timeout=timeout, what=f"session {sk} to become idle")

    async def _idle(self, sk: str) -> bool:
        prefix = self.cfg.redis.prefix
        busy = await self.redis.exists(f"{prefix}:inbox:{sk}", f"{prefix}:running:{sk}", self.keys.lock(sk))
        return not busy and sk not in self.gateway.workers.tasks

    async def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            await self.daemon.stop()


async def wait_until(
    check: Callable[[], Any], *, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"
) -> None:
    """Poll ``check`` (sync or async) until it is truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def running_daemon(
    tmp_path: Path,
    fake: FakeOpenAI,
    redis_url: str,
    redis_prefix: str,
    *,
    channel: RecordingChannel | None = None,
    workspace: str = "workspace",
    **sections: dict[str, Any],
) -> AsyncIterator[Bot]:
    """Start a daemon for the test and stop it afterwards (unless the test already did)."""
    cfg = make_config(tmp_path, fake, redis_url, redis_prefix, workspace=workspace, **sections)
    recording = channel or RecordingChannel()
    daemon = Daemon(cfg, channels={CHANNEL: recording}, with_http=False, with_scheduler=False)
    await daemon.start()
    bot = Bot(daemon, recording, cfg)
    try:
        yield bot
    finally:
        await bot.stop()


class Gate:
    """A responder for :class:`FakeOpenAI` that holds every request until released.

    ``fake.responder = gate`` (with an empty script): each request waits for one
    :meth:`release`, then answers with the next of ``replies`` (or echoes the last user
    message when they run out). ``waiting`` counts requests held right now (``peak``: the most at once); ``hung_up``
    counts held requests whose client went away (the fake's own ``disconnects`` only
    counts clients that leave while a reply is being written).
    """

    def __init__(self, *replies: Reply) -> None:
        self.replies: deque[Reply] = deque(replies)
        self.waiting = 0
        self.peak = 0  # the most requests held at once
        self.hung_up = 0
        self._permits = asyncio.Semaphore(0)

    async def __call__(self, body: dict[str, Any]) -> Reply:
        self.waiting += 1
        self.peak = max(self.peak, self.waiting)
        try:
            await self._permits.acquire()
        except asyncio.CancelledError:
            self.hung_up += 1
            raise
        finally:
            self.waiting -= 1
        return self.replies.popleft() if self.replies else echo_last_user(body)

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self._permits.release()

    async def wait_waiting(self, n: int = 1, timeout: float = 10.0) -> None:
        await wait_until(lambda: self.waiting >= n, timeout=timeout, what=f"{n} held LLM request(s)")

    async def wait_hung_up(self, n: int = 1, timeout: float = 10.0) -> None:
        await wait_until(lambda: self.hung_up >= n, timeout=timeout, what=f"{n} client(s) to hang up")


def roles(messages: list[Message]) -> list[str]:
    return [m.role for m in messages]


def request_texts(body: dict[str, Any], role: str = "user") -> list[str]:
    """The contents of one role's messages in a recorded LLM request."""
    return [str(m.get("content") or "") for m in body["messages"] if m.get("role") == role]


def assert_valid_history(messages: list[Message]) -> None:
    """Every assistant tool call has exactly one result, and every result has a call."""
    open_calls: set[str] = set()
    for message in messages:
        if message.role == "assistant" and message.tool_calls:
            open_calls.update(c.id for c in message.tool_calls)
        elif message.role == "tool":
            assert message.tool_call_id in open_calls, f"orphan tool result {message.tool_call_id}"
            open_calls.discard(message.tool_call_id)
    assert not open_calls, f"tool calls without a result: {open_calls}"
