"""Several replicas on one Redis, the concurrency cap, a missed /stop broadcast, and
scheduled runs going through the gateway."""

from __future__ import annotations

from pathlib import Path

from agent.types import RunRequest, ToolPolicy
from bot.app import ScheduledRunner
from bot.session_keys import cron_session_key
from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.fakes.recording_channel import RecordingChannel
from tests.integration.gateway_harness import (
    CHANNEL,
    DEFAULT_CHAT,
    Gate,
    assert_valid_history,
    dm_session,
    request_texts,
    roles,
    running_daemon,
    wait_until,
)


async def test_one_session_never_runs_on_two_replicas_at_once(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    gate = Gate(Reply.text("answer one"), Reply.text("answer two"))
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(
            tmp_path, fake, redis_url, redis_prefix, workspace="ws-a", queue={"mode": "followup"}
        ) as a,
        running_daemon(
            tmp_path,
            fake,
            redis_url,
            redis_prefix,
            workspace="ws-b",
            channel=RecordingChannel(),
            queue={"mode": "followup"},
        ) as b,
    ):
        assert (await a.send("question one", dedupe_key="evt-1")).status == "queued"
        await gate.wait_waiting(1)
        assert (await b.send("question one", dedupe_key="evt-1")).status == "duplicate"
        assert (await b.send("question two", dedupe_key="evt-2")).status == "queued"
        # b's worker finds the session locked by a and leaves the message to a's worker.
        gate.release(2)
        await a.channel.wait_for(lambda ch: len(ch.texts("part")) == 2)
        await a.wait_idle()
        assert a.channel.texts("part") == ["answer one", "answer two"]
        assert b.channel.sent == []
        assert len(fake.requests) == 2
        second = fake.requests[1]["messages"]
        assert [(m["role"], m["content"]) for m in second[1:]] == [
            ("user", "question one"),
            ("assistant", "answer one"),
            ("user", "question two"),
        ]


async def test_concurrency_cap_queues_sessions_without_losing_any(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    gate = Gate()
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, gateway={"max_concurrent_runs": 1}) as bot,
    ):
        for user in ("u1", "u2", "u3"):
            await bot.send(f"hello from {user}", chat_id=user)
        for n in (1, 2, 3):
            await fake.wait_for_requests(n)
            await gate.wait_waiting(1)
            gate.release()
        await bot.channel.wait_for(lambda ch: len(ch.texts("part")) == 3)
        assert gate.peak == 1  # never more than one run at a time
        by_chat = {s.chat_id: s.text for s in bot.channel.sent}
        assert by_chat == {u: f"hello from {u}" for u in ("u1", "u2", "u3")}
        assert len(fake.requests) == 3


async def test_a_missed_stop_broadcast_is_noticed_before_the_next_llm_call(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        marker = bot.cfg.workspace / "started"
        fake.script(
            Reply.tool_calls([Call("bash", {"command": "touch started; sleep 1"})]),
            Reply.text("should never be asked for"),
        )
        await bot.send("work for a second")
        await wait_until(marker.exists, what="the tool to start")
        # A /stop whose pub/sub message never arrived: only the cancel key records it.
        now_s, now_us = await bot.redis.time()
        await bot.redis.set(f"{redis_prefix}:cancel:{dm_session()}", repr(now_s + now_us / 1e6), ex=60)
        await bot.wait_idle()
        assert len(fake.requests) == 1
        assert bot.channel.texts("part") == []
        history = await bot.history()
        assert roles(history) == ["user", "assistant", "tool"]
        assert_valid_history(history)


async def test_scheduled_runs_report_their_outcome(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        runner = ScheduledRunner(bot.gateway, bot.app.channels)

        def fire(job: str, text: str) -> RunRequest:
            return RunRequest(
                session_key=cron_session_key("main", job),
                channel=CHANNEL,
                chat_id=DEFAULT_CHAT,
                text=text,
                kind="cron",
                prompt_mode="minimal",
                tool_policy=ToolPolicy(context="scheduled"),
                meta={"fresh_session": "1", "job_id": job},
            )

        fake.script(Reply.text("Daily report: all good."), Reply.text("Nothing new today. NO_REPLY"))
        first = await runner.run_scheduled(fire("daily", "write the report"), timeout_s=10)
        assert (first.run_status, first.delivery_status) == ("ok", "delivered")
        assert bot.channel.texts("part") == ["Daily report: all good."]
        second = await runner.run_scheduled(fire("daily", "write the report again"), timeout_s=10)
        assert (second.run_status, second.delivery_status) == ("ok", "silent")
        assert bot.channel.texts("part") == ["Daily report: all good."]
        # Every fire starts a fresh session: the second request does not see the first.
        assert request_texts(fake.requests[1]) == ["write the report again"]
        history = await bot.sessions.history(cron_session_key("main", "daily"))
        assert [m.content for m in history] == ["write the report again", "Nothing new today. NO_REPLY"]
