"""Scale-out end to end: three ``botd run`` processes on one Redis (one prefix).

Slack runs in HTTP mode and Telegram in webhook mode, every replica on its own HTTP
port, all of them talking to one fake Slack, one fake Telegram and one fake model in
this process; the test plays the load balancer and spreads the platforms' POSTs
round-robin over the replicas. What is checked (README "Delivery guarantees"):

* every message is answered exactly once, whichever replica took it;
* the runs of one session never overlap, across replicas (in flight at the fake model
  at most one request per session; each request carries every earlier answer);
* ``/stop`` sent to one replica stops the run another replica holds;
* a cron job fires once across the three (one model request, one delivery);
* a replica killed with SIGKILL mid-run loses nothing: after ``gateway.lock_ttl_s``
  another replica runs the message again and its answer is posted once.

A second scenario runs Telegram in polling mode on three replicas: one leader polls,
and when it is killed another takes over within ``telegram.poll_lease_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from tests.e2e.botd_process import BOTD, BotdProcess, botd_run, clean_env, free_port, write_config
from tests.e2e.chat_rig import (
    MarkerLLM,
    Ports,
    assistant_texts,
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
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

REPLICAS = 3
LOCK_TTL_S = 3.0
SLACK_USERS = ["UAMY", "UBEN", "UCAT", "USTOP", "UKILL"]
TG_USERS = [4101, 4102, 4103]
CRON_CHANNEL = "CCRON"


@dataclass
class Cluster:
    tmp: Path
    config_path: Path
    prefix: str
    llm: MarkerLLM
    slack: FakeSlack
    tg: FakeTelegram
    bots: list[BotdProcess]
    http: aiohttp.ClientSession
    redis: aioredis.Redis
    _rr: itertools.count[int] = field(default_factory=itertools.count)

    def live(self) -> list[BotdProcess]:
        return [b for b in self.bots if b.proc.returncode is None]

    def next_bot(self) -> BotdProcess:
        live = self.live()
        return live[next(self._rr) % len(live)]

    async def slack_dm(self, user: str, text: str, bot: BotdProcess | None = None) -> None:
        bot = bot or self.next_bot()
        status = await post_slack(self.http, bot.url, self.slack, slack_dm_body(self.slack, user, text))
        assert status == 200, f"slack event refused by {bot.url}: {status}"

    async def telegram_dm(self, user_id: int, text: str, bot: BotdProcess | None = None) -> None:
        bot = bot or self.next_bot()
        status = await post_telegram(self.http, bot.url, telegram_dm_update(self.tg, user_id, text))
        assert status == 200, f"telegram update refused by {bot.url}: {status}"

    def bot_texts(self) -> list[str]:
        return slack_texts(self.slack) + telegram_texts(self.tg)

    async def holder_pid(self, session_key: str) -> int | None:
        """The pid of the replica holding the session lock (tokens are host:pid:…)."""
        token = await self.redis.get(f"{self.prefix}:lock:{session_key}")
        return int(str(token).split(":")[1]) if token else None

    def by_pid(self, pid: int) -> BotdProcess:
        return next(b for b in self.bots if b.proc.pid == pid)

    def logs(self) -> str:
        return "\n".join(f"--- {b.url}\n{b.log()[-2500:]}" for b in self.bots)


def replica_config(tmp: Path, name: str, port: int, ports: Ports, redis_url: str, prefix: str,
                   webhook_url: str | None, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "agent": {"workspace": str(tmp / f"ws-{name}")},
        "llm": {"base_url": ports.llm.base_url, "api_key": "test-key", "max_retries": 0, "request_timeout_s": 30},
        "redis": {"url": redis_url, "prefix": prefix},
        "http": {"port": port},
        "queue": {"mode": "followup", "debounce_ms": 0},
        "gateway": {"lock_ttl_s": LOCK_TTL_S, "shutdown_grace_s": 2},
        "log": {"level": "info"},
        **channel_sections(ports, tg_mode=overrides.pop("tg_mode", "webhook"), webhook_url=webhook_url),
    }
    for section, values in overrides.items():
        config.setdefault(section, {}).update(values)
    return config


@contextlib.asynccontextmanager
async def replicas(
    tmp: Path, ports: Ports, redis_url: str, prefix: str, count: int, **overrides: Any
) -> AsyncIterator[tuple[list[BotdProcess], Path]]:
    """``count`` botd processes sharing Redis and the fakes; yields them and the first config."""
    port_list = [free_port() for _ in range(count)]
    webhook_url = f"http://127.0.0.1:{port_list[0]}/telegram"
    paths = []
    for index, port in enumerate(port_list):
        name = "abc"[index] if index < 3 else str(index)
        config = replica_config(tmp, name, port, ports, redis_url, prefix, webhook_url, **dict(overrides))
        paths.append(write_config(tmp / f"botd-{name}.yaml", config))
    async with contextlib.AsyncExitStack() as stack:
        bots = [
            await stack.enter_async_context(botd_run(path, port, tmp))
            for path, port in zip(paths, port_list, strict=True)
        ]
        await asyncio.gather(*(b.wait_healthy(60) for b in bots))
        for bot in bots:
            await eventually_ready(bot)
        yield bots, paths[0]
        # Graceful stop of the survivors: each must drain and exit 0.
        codes = await asyncio.gather(*(b.terminate() for b in bots if b.proc.returncode is None))
        assert all(code == 0 for code in codes), codes


async def eventually_ready(bot: BotdProcess, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while True:
        status, body = await bot.get("/readyz")
        if status == 200:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{bot.url} not ready: {body}\n{bot.log()[-3000:]}")
        await asyncio.sleep(0.1)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> AsyncIterator[Cluster]:
    tmp = tmp_path_factory.mktemp("replicas")
    prefix = f"e2erep{uuid.uuid4().hex[:8]}"
    llm = MarkerLLM(first_byte_s=0.15, chunk_delay_s=0.02)
    async with llm, FakeSlack() as slack, FakeTelegram() as tg, aiohttp.ClientSession() as http:
        ports = Ports(llm=llm, slack=slack, tg=tg, slack_users=SLACK_USERS, slack_channels=[CRON_CHANNEL],
                      tg_users=TG_USERS)
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            async with replicas(tmp, ports, redis_url, prefix, REPLICAS) as (bots, config_path):
                yield Cluster(tmp, config_path, prefix, llm, slack, tg, bots, http, client)
        finally:
            await client.aclose()


# -- every message once, sessions serialized ---------------------------------------------


async def test_round_robin_answers_every_message_once_and_serializes_each_session(cluster: Cluster) -> None:
    c = cluster
    sessions: list[tuple[str, str | int]] = [("slack", u) for u in SLACK_USERS[:3]] + [("telegram", u) for u in TG_USERS]
    per_session = 4
    marks: dict[str, list[str]] = {}
    sends = []
    for i in range(per_session):
        for s_index, (kind, who) in enumerate(sessions):
            session = f"ssrr{s_index}"
            mark = f"mkrr{s_index}x{i}"
            marks.setdefault(session, []).append(mark)
            text = f"{session} {mark} please acknowledge"
            if kind == "slack":
                sends.append(c.slack_dm(str(who), text))
            else:
                sends.append(c.telegram_dm(int(who), text))
    # All at once, spread over the replicas: messages of one session land on different
    # replicas while its earlier messages are still running.
    for batch_start in range(0, len(sends), len(sessions)):
        await asyncio.gather(*sends[batch_start : batch_start + len(sessions)])
        await asyncio.sleep(0.1)

    every = [m for ms in marks.values() for m in ms]
    await eventually(lambda: all(count_mark(c.bot_texts(), m) >= 1 for m in every), 30,
                     f"answers to all {len(every)} messages\n{c.logs()}")
    await asyncio.sleep(1.0)  # room for a duplicate, if one were coming
    texts = c.bot_texts()
    counts = {m: count_mark(texts, m) for m in every}
    assert all(n == 1 for n in counts.values()), counts

    for session, session_marks in marks.items():
        assert c.llm.peak[session] == 1, f"{session} had {c.llm.peak[session]} requests in flight at once"
        served = [s for s in c.llm.served if s.session == session]
        # Ordering evidence: each request carries every earlier answer of its session, in order.
        answers: list[str] = []
        for s in served:
            assert assistant_texts(s.body) == answers, (session, assistant_texts(s.body), answers)
            assert s.answer is not None
            answers.append(s.answer)
        # Each message was asked about exactly once.
        asked = [m for s in served for m in s.marks]
        assert sorted(asked) == sorted(session_marks), (session, asked)
    # Sessions really were contended: messages arrived while their session was running
    # (followup mode then runs them together next).
    assert any(len(s.marks) > 1 for s in c.llm.served if s.session in marks)
    # The traffic really was spread: every replica ran some of it.
    for bot in c.bots:
        assert "run.finished" in bot.log(), f"{bot.url} ran nothing"


# -- /stop across replicas -------------------------------------------------------------------


async def test_stop_sent_to_another_replica_stops_the_run(cluster: Cluster) -> None:
    c = cluster
    user = TG_USERS[0]
    session_key = f"agent:main:telegram:dm:{user}"
    essay = " ".join(f"word{i}" for i in range(300))
    c.llm.script_for("mkstop1", Reply.text(essay, chunk_chars=6, chunk_delay_s=0.05))
    disconnects = c.llm.disconnects.count
    await c.telegram_dm(user, "ssstop mkstop1 write a long essay", bot=c.bots[0])
    await eventually(lambda: bool(c.llm.requests_with("mkstop1")), 10, "the model request")
    pid = await c.holder_pid(session_key)
    assert pid is not None, "no replica holds the session lock"
    holder = c.by_pid(pid)
    other = next(b for b in c.live() if b is not holder)

    await c.telegram_dm(user, "/stop", bot=other)
    await c.llm.disconnects.wait(disconnects + 1, timeout_s=5)
    await eventually(lambda: "Stopped." in telegram_texts(c.tg, user), 5, "Stopped.")
    await asyncio.sleep(1.0)
    texts = telegram_texts(c.tg, user)
    assert texts.count("Stopped.") == 1
    assert not any("word299" in t for t in texts), "the stopped answer was delivered"
    assert len(c.llm.requests_with("mkstop1")) == 1
    assert "run.cancelling" in holder.log()


# -- cron: one fire across the replicas -----------------------------------------------------


async def test_cron_job_fires_once_across_replicas(cluster: Cluster) -> None:
    c = cluster
    proc = await asyncio.create_subprocess_exec(
        *BOTD, "--config", str(c.config_path), "cron", "add", "--in", "2s", "--channel", "slack",
        "--chat-id", CRON_CHANNEL, "--prompt", "sscron mkcron1 report the weather", "--id", "e2e-once",
        cwd=str(c.tmp), env=clean_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert out.decode().strip() == "e2e-once"

    await eventually(lambda: count_mark(slack_texts(c.slack, CRON_CHANNEL), "mkcron1") >= 1, 20,
                     f"the cron delivery\n{c.logs()}")
    await asyncio.sleep(2.0)  # the other replicas' timers fired too by now
    assert len(c.llm.requests_with("mkcron1")) == 1
    assert slack_texts(c.slack, CRON_CHANNEL) == ["ack mkcron1"]
    ran = [b for b in c.bots if "e2e-once" in b.log() and "run.finished" in b.log()]
    assert ran, "no replica logged the cron run"
    claims = [k async for k in c.redis.scan_iter(f"{c.prefix}:fire:e2e-once:*")]
    assert len(claims) == 1, claims


# -- a replica dies mid-run ----------------------------------------------------------------


async def test_sigkill_mid_run_is_retried_elsewhere_and_answered_once(cluster: Cluster) -> None:
    c = cluster
    user = "UKILL"
    session_key = f"agent:main:slack:dm:{user}"
    final = "Recovered: the answer to mkkill1 is forty-two. " * 2
    final = final.strip()
    # First attempt streams slowly (the replica dies during it); the retry streams fast.
    c.llm.script_for("mkkill1", Reply.text(final, chunk_chars=3, chunk_delay_s=0.15), Reply.text(final))
    disconnects = c.llm.disconnects.count
    await c.slack_dm(user, "sskill mkkill1 what is the answer?", bot=c.bots[1])
    await eventually(lambda: bool(c.llm.requests_with("mkkill1")), 10, "the first model request")
    pid = await c.holder_pid(session_key)
    assert pid is not None
    victim = c.by_pid(pid)
    await asyncio.sleep(0.5)  # mid-stream: some of the answer is out, the rest is not
    victim.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    await victim.proc.wait()
    await c.llm.disconnects.wait(disconnects + 1, timeout_s=5)

    await eventually(lambda: len(c.llm.requests_with("mkkill1")) >= 2, LOCK_TTL_S + 10,
                     f"the retry on another replica\n{c.logs()}")
    retried_after = time.monotonic() - killed_at
    new_pid = await c.holder_pid(session_key)
    assert new_pid is None or new_pid != pid
    await eventually(lambda: final in slack_texts(c.slack, f"D{user}"), 10, "the final answer")
    await asyncio.sleep(1.5)
    texts = slack_texts(c.slack, f"D{user}")
    assert texts.count(final) == 1, texts
    assert len(c.llm.requests_with("mkkill1")) == 2
    assert retried_after < LOCK_TTL_S + 5, retried_after
    # The dead replica's last preview (a prefix of the answer) may remain; it never equals it.

    # The survivors keep serving.
    await c.slack_dm(user, "sskill mkkill2 still there?")
    await eventually(lambda: count_mark(slack_texts(c.slack, f"D{user}"), "mkkill2") == 1, 10, "a later answer")


# -- Telegram polling: one leader, taken over when it dies ---------------------------------


LEASE_S = 3.0


async def test_polling_has_one_leader_and_a_standby_takes_over_after_sigkill(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> None:
    tmp = tmp_path_factory.mktemp("polling")
    prefix = f"e2epoll{uuid.uuid4().hex[:8]}"
    llm = MarkerLLM()
    async with llm, FakeTelegram() as tg:
        ports = Ports(llm=llm, tg=tg, tg_users=TG_USERS)
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        lease_key = f"{prefix}:kv:telegram:poller:{tg.bot_id}"
        try:
            async with replicas(tmp, ports, redis_url, prefix, 3, tg_mode="polling",
                                telegram={"poll_lease_s": LEASE_S}) as (bots, _):
                await eventually(lambda: bool(tg.calls_to("getUpdates")), 10, "a poller")
                leader_token = str(await client.get(lease_key) or "")
                assert leader_token, "no poller lease in Redis"
                leader = next(b for b in bots if f":{b.proc.pid}:" in f"{leader_token}:")

                tg.push_message(tg.private_message(TG_USERS[0], "sspoll mkpoll1 hello"))
                await eventually(lambda: count_mark(telegram_texts(tg), "mkpoll1") == 1, 10, "the first answer")
                await asyncio.sleep(2 * LEASE_S / 3 + 0.5)  # a few renewal rounds of the standbys
                assert tg.terminated_polls == 0, "two replicas polled getUpdates at the same time"
                assert [c.status for c in tg.calls_to("getUpdates") if c.status != 200] == []
                assert [b for b in bots if "telegram.poller_leader" in b.log()] == [leader]
                assert await client.get(lease_key) == leader_token

                leader.proc.send_signal(signal.SIGKILL)
                killed_at = time.monotonic()
                await leader.proc.wait()
                tg.push_message(tg.private_message(TG_USERS[1], "sspoll mkpoll2 anyone?"))
                new_token = ""
                while not new_token or new_token == leader_token:
                    assert time.monotonic() - killed_at < LEASE_S + 10, "no standby took the lease"
                    await asyncio.sleep(0.05)
                    new_token = str(await client.get(lease_key) or "")
                took = time.monotonic() - killed_at
                # The lease expires at most LEASE_S after the last renewal; standbys try every LEASE_S / 3.
                assert took < LEASE_S + LEASE_S / 3 + 1.5, f"takeover took {took:.1f} s"
                await eventually(lambda: count_mark(telegram_texts(tg), "mkpoll2") == 1, 10,
                                 "the new leader to answer\n" + "\n".join(b.log()[-2000:] for b in bots))
                new_leader = next(b for b in bots if f":{b.proc.pid}:" in f"{new_token}:")
                assert new_leader is not leader and "telegram.poller_leader" in new_leader.log()

                # The dead leader's last long poll is the only one ever cut short.
                cut_short = tg.terminated_polls
                assert cut_short <= 1
                await asyncio.sleep(1.5)
                assert tg.terminated_polls == cut_short
                assert count_mark(telegram_texts(tg), "mkpoll1") == 1
                assert count_mark(telegram_texts(tg), "mkpoll2") == 1
        finally:
            await client.aclose()
