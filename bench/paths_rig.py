"""The rig of ``bench/paths.py``: one real botd process per path, the fake platform that
feeds it (in this process), and how each path hands botd a message and sees its answer
(what is read from outside botd is in ``bench/paths_probes.py``).

Every path has the same face (:class:`Path`): ``send(session, message)`` hands one
message to botd the way that platform does and records when it did (``handed``), and
``expect(mark)`` resolves with the time the platform saw a bot message holding the
whole answer. Times are ``time.monotonic()`` (CLOCK_MONOTONIC, system-wide on Linux),
so they compare with the fake model's, which runs in another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path as FsPath
from typing import Any

import aiohttp

from bench.common import FakeLLM
from bench.replicas_fleet import MARK, MarkWatch, WatchedSlack, message_text, user_of, wait_ready
from bot.store.embedded import EmbeddedPaths
from bot.store.valkey_process import send_shutdown
from tests.e2e.botd_process import BOTD, botd_run, clean_env, free_port, write_config
from tests.e2e.chat_rig import (
    EVENTS_PATH,
    WEBHOOK_PATH,
    WEBHOOK_SECRET,
    post_telegram,
    slack_dm_body,
    telegram_dm_update,
)
from tests.fakes.slack_server import signed_json
from tests.fakes.telegram_server import FakeTelegram

PATHS = ("telegram-polling", "telegram-webhook", "slack-socket", "slack-http", "console")
TELEGRAM_TOKEN = "123456:BENCH-token-for-fake"
TELEGRAM_USER_BASE = 700_000  # a session's Telegram user (and private chat) id is this + its number


# ---- the paths -------------------------------------------------------------------------


class Refused(RuntimeError):
    """botd answered an inbound update with an HTTP error (e.g. 503 when it sheds load)."""


class Path:
    """One way into botd; see the module docstring. ``pid`` is the root of the measured
    process tree (botd and its embedded Valkey), ``log_path`` its JSON log."""

    def __init__(self, name: str, workspace: FsPath, log_path: FsPath, pid: int) -> None:
        self.name, self.workspace, self.log_path, self.pid = name, workspace, log_path, pid
        self.handed: dict[str, float] = {}
        self.refusals = 0  # deliveries botd refused (and that were made again)

    def platform_calls(self) -> Counter[str]:
        """The platform API calls botd has made so far, by method (none for the console)."""
        return Counter()

    def handed_at(self, mark: str) -> float | None:
        """When the message with ``mark`` was handed to botd (None: not yet, or unknown)."""
        return self.handed.get(mark)

    def expect(self, mark: str) -> asyncio.Future[float]:
        raise NotImplementedError

    async def send(self, session: int, message: int) -> None:
        raise NotImplementedError


class WatchedTelegram(MarkWatch, FakeTelegram):
    """The fake Bot API, recording when ``getUpdates`` first served each marker and
    watching ``sendMessage``/``editMessageText`` for answers."""

    def __init__(self, token: str) -> None:
        super().__init__(token)
        self.waiting = {}
        self.served: dict[str, float] = {}

    async def _m_getUpdates(self, p: dict[str, Any]) -> Any:
        batch = await super()._m_getUpdates(p)
        now = time.monotonic()
        for update in batch:
            for mark in MARK.findall(str((update.get("message") or {}).get("text") or "")):
                self.served.setdefault(mark, now)
        return batch

    async def _m_sendMessage(self, p: dict[str, Any]) -> Any:
        result = await super()._m_sendMessage(p)
        self.seen(str(p.get("text") or ""))
        return result

    async def _m_editMessageText(self, p: dict[str, Any]) -> Any:
        result = await super()._m_editMessageText(p)
        self.seen(str(p.get("text") or ""))
        return result


def mark_in(text: str) -> str:
    return str(MARK.findall(text)[-1])


class TelegramPath(Path):
    def __init__(self, name: str, workspace: FsPath, log_path: FsPath, pid: int, fake: WatchedTelegram,
                 url: str, http: aiohttp.ClientSession) -> None:
        super().__init__(name, workspace, log_path, pid)
        self.fake, self.url, self.http = fake, url, http

    def platform_calls(self) -> Counter[str]:
        return Counter(call.method for call in self.fake.calls)

    def handed_at(self, mark: str) -> float | None:
        if self.name == "telegram-polling":
            return self.fake.served.get(mark)  # handed when getUpdates serves it
        return super().handed_at(mark)

    def expect(self, mark: str) -> asyncio.Future[float]:
        return self.fake.expect(mark)

    async def send(self, session: int, message: int) -> None:
        text = message_text(session, message)
        update = telegram_dm_update(self.fake, TELEGRAM_USER_BASE + session, text)
        if self.name == "telegram-polling":
            self.fake.push_update(update)
            return
        self.handed[mark_in(text)] = time.monotonic()
        status = await post_telegram(self.http, self.url, update)
        if status != 200:
            raise Refused(f"{self.name}: botd answered {status} to a webhook update")


class SlackPath(Path):
    """Slack delivers an event again when the app refuses it (HTTP: an error status;
    Socket Mode: no ack within 3 s), with the attempt number, up to three retries. botd
    refuses on purpose when it sheds load, so the driver does the same, sooner than
    Slack's minutes (``redeliver_s``), and counts the refusals."""

    ACK_DEADLINE_S = 3.0
    RETRIES = 3

    def __init__(self, name: str, workspace: FsPath, log_path: FsPath, pid: int, fake: WatchedSlack,
                 url: str, http: aiohttp.ClientSession, redeliver_s: float) -> None:
        super().__init__(name, workspace, log_path, pid)
        self.fake, self.url, self.http, self.redeliver_s = fake, url, http, redeliver_s

    def platform_calls(self) -> Counter[str]:
        return Counter(call.method for call in self.fake.calls)

    def expect(self, mark: str) -> asyncio.Future[float]:
        return self.fake.expect(mark)

    async def send(self, session: int, message: int) -> None:
        text = message_text(session, message)
        body = slack_dm_body(self.fake, user_of(session), text)
        self.handed[mark_in(text)] = time.monotonic()
        for attempt in range(self.RETRIES + 1):
            if attempt:
                self.refusals += 1
                await asyncio.sleep(self.redeliver_s)
            if await self._deliver(body, attempt):
                return
        raise Refused(f"{self.name}: botd refused an event {self.RETRIES + 1} times")

    async def _deliver(self, body: dict[str, Any], attempt: int) -> bool:
        if self.name == "slack-socket":
            envelope = await self.fake.send_envelope("events_api", body, retry_attempt=attempt)
            deadline = time.monotonic() + self.ACK_DEADLINE_S
            while envelope not in self.fake.acks:
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.02)
            return True
        raw, headers = signed_json(body, self.fake.signing_secret)
        if attempt:
            headers |= {"X-Slack-Retry-Num": str(attempt), "X-Slack-Retry-Reason": "http_error"}
        async with self.http.post(self.url + EVENTS_PATH, data=raw, headers=headers) as resp:
            await resp.read()
            return resp.status == 200


class ConsolePath(Path):
    """``botd chat`` with its stdin and stdout on pipes: a line written is a message, and
    an answer is complete once its marker (the last word) is on stdout."""

    def __init__(self, workspace: FsPath, log_path: FsPath, proc: asyncio.subprocess.Process) -> None:
        super().__init__("console", workspace, log_path, proc.pid)
        self.proc = proc
        self.waiting: dict[str, asyncio.Future[float]] = {}
        self.output = bytearray()  # everything before the banner, then a short tail
        self.banner = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    def expect(self, mark: str) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[mark] = fut
        return fut

    async def send(self, session: int, message: int) -> None:
        text = message_text(session, message)
        assert self.proc.stdin is not None
        self.handed[mark_in(text)] = time.monotonic()
        self.proc.stdin.write(text.encode() + b"\n")
        await self.proc.stdin.drain()

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while chunk := await self.proc.stdout.read(65536):
            now = time.monotonic()
            self.output += chunk
            if not self.banner.is_set() and b"type a message" in self.output:
                self.banner.set()
            for mark in MARK.findall(self.output.decode(errors="replace")):
                fut = self.waiting.pop(mark, None)
                if fut is not None and not fut.done():
                    fut.set_result(now)
            if self.banner.is_set():
                del self.output[:-32]  # a marker cut between two reads is whole next time

    async def close(self, timeout_s: float = 60.0) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(ConnectionError):
            self.proc.stdin.write(b"/exit\n")
            await self.proc.stdin.drain()
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            await asyncio.to_thread(stop_orphaned_store, self.workspace)
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


# ---- starting one --------------------------------------------------------------------------


def base_config(workspace: FsPath, llm: FakeLLM, max_concurrent_runs: int, debounce_ms: int | None) -> dict[str, Any]:
    """botd's defaults but for where things are; ``max_concurrent_runs`` raised so a
    thousand chats at once are not capped at 64 (the concurrency figures say so)."""
    config: dict[str, Any] = {
        "agent": {"workspace": str(workspace)},
        "llm": {"base_url": llm.base_url, "api_key": "bench-key", "request_timeout_s": 300},
        "gateway": {"max_concurrent_runs": max_concurrent_runs},
    }
    if debounce_ms is not None:
        config["queue"] = {"debounce_ms": debounce_ms}
    return config


@contextlib.asynccontextmanager
async def open_path(name: str, workdir: FsPath, config: dict[str, Any], sessions: int | None,
                    http: aiohttp.ClientSession, redeliver_s: float = 1.0) -> AsyncIterator[Path]:
    """``name``'s fake platform here and botd in its own process, ready for messages;
    ``sessions`` is how many session numbers (from 1) the allowlist must let in, None
    for direct messages open to anyone (an allowlist of 10,000 ids is memory of its own)."""
    workspace = FsPath(config["agent"]["workspace"])
    if name == "console":
        async with _console(workdir, config, workspace) as console:
            yield console
        return
    port = free_port()
    config = {**config, "http": {"port": port}}
    fakes: contextlib.AsyncExitStack = contextlib.AsyncExitStack()
    async with fakes:
        if name.startswith("telegram"):
            tg = WatchedTelegram(TELEGRAM_TOKEN)
            await fakes.enter_async_context(tg)
            config["telegram"] = {
                "enabled": True, "token": TELEGRAM_TOKEN, "api_base_url": tg.base_url,
                "mode": "webhook" if name == "telegram-webhook" else "polling",
                **_access(sessions, lambda s: str(TELEGRAM_USER_BASE + s)),
            }
            if name == "telegram-webhook":
                config["telegram"] |= {"webhook_url": f"http://127.0.0.1:{port}{WEBHOOK_PATH}",
                                       "webhook_secret": WEBHOOK_SECRET, "webhook_path": WEBHOOK_PATH}
        else:
            slack = WatchedSlack()
            await fakes.enter_async_context(slack)
            config["slack"] = {
                "enabled": True, "mode": "socket" if name == "slack-socket" else "http",
                "bot_token": slack.bot_token, "app_token": slack.app_token,
                "signing_secret": slack.signing_secret, "api_base_url": slack.api_url,
                "events_path": EVENTS_PATH,
                **_access(sessions, user_of),
            }
        path = write_config(workdir / "botd.yaml", config)
        async with botd_run(path, port, workdir) as botd:
            try:
                await wait_ready(botd)
                if name == "telegram-webhook":
                    await tg.wait_for(lambda: bool(tg.webhook_url), 30)
                if name == "slack-socket":
                    await slack.wait_connected(within=30)
                if name.startswith("telegram"):
                    yield TelegramPath(name, workspace, botd.log_path, botd.proc.pid, tg, botd.url, http)
                else:
                    yield SlackPath(name, workspace, botd.log_path, botd.proc.pid, slack, botd.url, http,
                                    redeliver_s)
            finally:
                # SIGTERM, also when interrupted: botd stops its Valkey. When botd has to be
                # killed instead, its Valkey would live on: stop it as botd would have.
                try:
                    code = await botd.terminate(60)
                except AssertionError:
                    await asyncio.to_thread(stop_orphaned_store, workspace)
                    raise
            if code != 0:
                raise RuntimeError(f"botd exited with {code} on SIGTERM:\n{botd.log()[-3000:]}")


def _access(sessions: int | None, user: Callable[[int], str]) -> dict[str, Any]:
    """Direct messages from the users of session numbers 1 to ``sessions``, or from anyone."""
    if sessions is None:
        return {"dm_policy": "open"}
    return {"allow_from": [user(s) for s in range(1, sessions + 1)]}


def stop_orphaned_store(workspace: FsPath) -> None:
    """Shut down the embedded Valkey of a workspace whose botd was killed."""
    paths = EmbeddedPaths.for_workspace(workspace)
    with contextlib.suppress(OSError):
        send_shutdown(paths.socket, paths.password.read_text().strip())


@contextlib.asynccontextmanager
async def _console(workdir: FsPath, config: dict[str, Any], workspace: FsPath) -> AsyncIterator[ConsolePath]:
    path = write_config(workdir / "botd.yaml", config)
    proc = await asyncio.create_subprocess_exec(
        *BOTD, "--config", str(path), "chat", cwd=str(workdir), env=clean_env(),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    console = ConsolePath(workspace, workspace / ".botd" / "logs" / "chat.log", proc)
    try:
        try:
            await asyncio.wait_for(console.banner.wait(), 60)
        except TimeoutError:
            raise RuntimeError(f"botd chat did not start: {console.output[-2000:].decode(errors='replace')}") from None
        yield console
    finally:
        await console.close()
