"""/stop and /stopall: during a stream, during a tool, with queued messages, across replicas."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import psutil

from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.fakes.recording_channel import RecordingChannel
from tests.integration.gateway_harness import (
    Gate,
    assert_valid_history,
    dm_session,
    request_texts,
    roles,
    running_daemon,
    wait_until,
)

LONG_ANSWER = "This answer streams slowly, word by word, and it goes on for quite a while. " * 4


def _sleeper(marker: str) -> int | None:
    """The host pid of the ``sleep <marker>`` a tool started."""
    for proc in psutil.process_iter(["cmdline"]):
        if (proc.info["cmdline"] or [])[-1:] == [marker]:
            return int(proc.pid)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it has stopped running all the same.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:  # reaped meanwhile (ENOENT, or ESRCH while reading)
        return False


async def test_stop_during_a_stream(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        fake.script(Reply.text(LONG_ANSWER, chunk_chars=5, chunk_delay_s=0.05))
        await bot.send("tell me a long story")
        await bot.channel.wait_for(lambda ch: ch.previews)
        result = await bot.send("/stop")
        assert (result.status, result.detail) == ("command", "stop")
        await fake.disconnects.wait(1)
        await bot.wait_idle()
        assert bot.channel.texts("notice") == ["Stopped."]
        assert bot.channel.texts("part") == []
        run_id = bot.channel.previews[0][0]
        assert run_id in bot.channel.discarded
        history = await bot.history()
        assert roles(history) == ["user", "assistant"]  # the partial answer is kept
        assert LONG_ANSWER.startswith(history[1].content or "-")
        assert len(history[1].content or "") < len(LONG_ANSWER)
        # The session goes on normally afterwards.
        fake.script(Reply.text("short one"))
        await bot.send("a short one please")
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        assert bot.channel.texts("part") == ["short one"]


async def test_stop_during_a_tool_kills_its_process(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        # $$ is a pid inside the tool's own PID namespace: find the process by its command line instead.
        marker = f"30.{os.getpid()}{uuid.uuid4().int % 10**6}"
        fake.script(
            Reply.tool_calls([Call("bash", {"command": f"exec sleep {marker}"})]),
            Reply.text("should never be asked for"),
        )
        await bot.send("run something slow")
        await wait_until(lambda: _sleeper(marker) is not None, what="the tool to start")
        pid = _sleeper(marker)
        assert pid is not None and _alive(pid)
        await bot.send("/stop")
        await wait_until(lambda: not _alive(pid), timeout=10, what="the tool's process to die")
        await bot.wait_idle()
        assert bot.channel.texts("notice") == ["Stopped."]
        assert bot.channel.texts("part") == []
        assert len(fake.requests) == 1
        history = await bot.history()
        assert roles(history) == ["user", "assistant", "tool"]
        assert_valid_history(history)
        assert history[2].content == "cancelled"


async def test_stop_leaves_queued_messages_to_run(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    gate = Gate(Reply.text("queued ones answered"))  # the first request never gets an answer
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, queue={"mode": "followup"}) as bot,
    ):
        await bot.send("first")
        await gate.wait_waiting(1)
        await bot.send("second")
        await bot.send("third")
        await bot.send("/stop")
        await gate.wait_hung_up(1)
        await gate.wait_waiting(1)  # the queued messages' run asks the model next
        gate.release()
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        await bot.wait_idle()
        assert bot.channel.texts("notice") == ["Stopped."]
        assert bot.channel.texts("part") == ["queued ones answered"]
        assert request_texts(fake.requests[1])[-2:] == ["second", "third"]
        users = [m.content for m in await bot.history() if m.role == "user"]
        assert users == ["first", "second", "third"]


async def test_stopall_drops_queued_messages(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    gate = Gate()
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, queue={"mode": "followup"}) as bot,
    ):
        await bot.send("first")
        await gate.wait_waiting(1)
        await bot.send("second")
        await bot.send("third")
        await bot.send("/stopall")
        await gate.wait_hung_up(1)
        await bot.wait_idle()
        assert bot.channel.texts("notice") == ["Stopped. Dropped 2 queued message(s)."]
        assert len(fake.requests) == 1
        assert bot.channel.texts("part") == []
        assert [m.content for m in await bot.history() if m.role == "user"] == ["first"]


async def test_stop_from_another_replica(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    gate = Gate()
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, workspace="ws-a") as a,
        running_daemon(
            tmp_path, fake, redis_url, redis_prefix, workspace="ws-b", channel=RecordingChannel()
        ) as b,
    ):
        await a.send("a question for replica a")
        await gate.wait_waiting(1)
        assert a.gateway.active_run(dm_session()) is not None
        assert b.gateway.active_run(dm_session()) is None
        result = await b.send("/stop")
        assert result.status == "command"
        await gate.wait_hung_up(1)
        await a.wait_idle()
        assert b.channel.texts("notice") == ["Stopped."]
        assert a.channel.sent == [] and b.channel.texts("part") == []
        assert len(fake.requests) == 1
        assert roles(await a.history()) == ["user"]


async def test_new_during_a_run_starts_from_an_empty_session(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        fake.script(Reply.text(LONG_ANSWER, chunk_chars=5, chunk_delay_s=0.05))
        await bot.send("the old conversation")
        await bot.channel.wait_for(lambda ch: ch.previews)
        await bot.send("/new")
        assert bot.channel.texts("notice") == ["Started a fresh session."]
        await bot.wait_idle()
        # The stopped run recorded its partial answer before the reset, not into the new session.
        assert await bot.history() == []
        assert bot.channel.texts("part") == []


async def test_new_from_another_replica_during_a_run(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with (
        FakeOpenAI() as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, workspace="ws-a") as a,
        running_daemon(
            tmp_path, fake, redis_url, redis_prefix, workspace="ws-b", channel=RecordingChannel()
        ) as b,
    ):
        fake.script(Reply.text(LONG_ANSWER, chunk_chars=5, chunk_delay_s=0.05))
        await a.send("the old conversation")
        await a.channel.wait_for(lambda ch: ch.previews)
        await b.send("/new")
        assert b.channel.texts("notice") == ["Started a fresh session."]
        await a.wait_idle()
        assert await a.history() == []
        fake.script(Reply.text("hello again"))
        await b.send("a new topic")
        await b.channel.wait_for(lambda ch: ch.texts("part"))
        assert request_texts(fake.requests[-1]) == ["a new topic"]


async def test_run_timeout_cancels_and_tells_the_user(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    gate = Gate()
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, gateway={"run_timeout_s": 0.5}) as bot,
    ):
        await bot.send("something that takes forever")
        await gate.wait_hung_up(1)
        await bot.channel.wait_for(lambda ch: ch.texts("notice"))
        await bot.wait_idle()
        [notice] = bot.channel.texts("notice")
        assert notice.startswith("Sorry — this took too long")
        assert bot.channel.texts("part") == []
        assert len(fake.requests) == 1
        assert roles(await bot.history()) == ["user"]
