"""One run per session, concurrency across sessions, and the queue modes (steer, followup,
interrupt), the inbox cap, and folding a burst into the running turn."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bot.gateway import worker
from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.integration.gateway_harness import Gate, request_texts, roles, running_daemon

SLOW_TOOL = Call("bash", {"command": "echo tool-ran"})


async def test_one_session_runs_one_message_at_a_time(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    gate = Gate(Reply.text("answer one"), Reply.text("answer two"))
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, queue={"mode": "followup"}) as bot,
    ):
        await bot.send("question one")
        await gate.wait_waiting(1)
        await bot.send("question two")
        await asyncio.sleep(0.3)
        assert len(fake.requests) == 1  # the second waits for the first run to end
        gate.release(2)
        await bot.channel.wait_for(lambda ch: len(ch.texts("part")) == 2)
        await bot.wait_idle()
        assert bot.channel.texts("part") == ["answer one", "answer two"]
        second = fake.requests[1]["messages"]
        assert [(m["role"], m["content"]) for m in second[1:]] == [
            ("user", "question one"),
            ("assistant", "answer one"),
            ("user", "question two"),
        ]
        assert roles(await bot.history()) == ["user", "assistant", "user", "assistant"]


async def test_different_sessions_run_concurrently(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    gate = Gate()
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot,
    ):
        await bot.send("from alice", chat_id="alice")
        await bot.send("from bob", chat_id="bob")
        # Both requests are held by the fake at the same moment: neither run waits for the other.
        await gate.wait_waiting(2)
        gate.release(2)
        await bot.channel.wait_for(lambda ch: len(ch.texts("part")) == 2)
        by_chat = {s.chat_id: s.text for s in bot.channel.sent if s.kind == "part"}
        assert by_chat == {"alice": "from alice", "bob": "from bob"}
        assert len(fake.requests) == 2


async def test_steer_injects_a_message_before_the_next_llm_call(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    gate = Gate(Reply.tool_calls([SLOW_TOOL]), Reply.text("done, and noted"))
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, queue={"mode": "steer"}) as bot,
    ):
        await bot.send("run the tool")
        await gate.wait_waiting(1)
        await bot.send("also, use French")
        gate.release(2)
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        await bot.wait_idle()
        assert bot.channel.texts("part") == ["done, and noted"]
        assert len(fake.requests) == 2  # no separate turn for the steered message
        second = fake.requests[1]["messages"]
        assert [m["role"] for m in second[1:]] == ["user", "assistant", "tool", "user"]
        assert second[-1]["content"] == "also, use French"
        assert "tool-ran" in second[-2]["content"]
        history = await bot.history()
        assert roles(history) == ["user", "assistant", "tool", "user", "assistant"]
        assert history[3].content == "also, use French"


async def test_followup_runs_a_queued_message_as_its_own_turn(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    gate = Gate(Reply.tool_calls([SLOW_TOOL]), Reply.text("tool answer"), Reply.text("followup answer"))
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, queue={"mode": "followup"}) as bot,
    ):
        await bot.send("run the tool")
        await gate.wait_waiting(1)
        await bot.send("and then this")
        gate.release(3)
        await bot.channel.wait_for(lambda ch: len(ch.texts("part")) == 2)
        await bot.wait_idle()
        assert bot.channel.texts("part") == ["tool answer", "followup answer"]
        assert len(fake.requests) == 3
        assert "and then this" not in request_texts(fake.requests[1])
        third = fake.requests[2]["messages"]
        assert [m["role"] for m in third[1:]] == ["user", "assistant", "tool", "assistant", "user"]
        assert third[-1]["content"] == "and then this"
        assert third[-2]["content"] == "tool answer"


async def test_interrupt_cancels_the_active_run(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with (
        FakeOpenAI() as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, queue={"mode": "interrupt"}) as bot,
    ):
        fake.script(
            Reply.text("a very slow answer", first_byte_delay_s=30),
            Reply.text("the new answer"),
        )
        await bot.send("long question")
        await fake.wait_for_requests(1)
        await bot.send("never mind, this instead")
        await fake.disconnects.wait(1)
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        await bot.wait_idle()
        assert bot.channel.texts("part") == ["the new answer"]
        assert len(fake.requests) == 2
        assert request_texts(fake.requests[1])[-1] == "never mind, this instead"
        history = await bot.history()
        assert [m.content for m in history if m.role == "user"] == [
            "long question",
            "never mind, this instead",
        ]
        assert history[-1].content == "the new answer"


async def test_inbox_cap_drops_the_oldest_and_tells_the_user(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    gate = Gate(Reply.text("first done"), Reply.text("rest done"))
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, queue={"mode": "followup", "cap": 2}) as bot,
    ):
        await bot.send("message 1")
        await gate.wait_waiting(1)
        for n in (2, 3, 4):
            await bot.send(f"message {n}")
        [notice] = bot.channel.texts("notice")
        assert "dropped" in notice and '"message 2"' in notice
        assert await bot.queued() == (2, 1)
        gate.release(2)
        await bot.channel.wait_for(lambda ch: len(ch.texts("part")) == 2)
        await bot.wait_idle()
        assert len(fake.requests) == 2
        assert request_texts(fake.requests[1])[-2:] == ["message 3", "message 4"]
        users = [m.content for m in await bot.history() if m.role == "user"]
        assert users == ["message 1", "message 3", "message 4"]


async def test_a_lone_message_starts_at_once_whatever_the_burst_window(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    gate = Gate(Reply.text("hello back"))
    async with (
        FakeOpenAI(responder=gate) as fake,
        # A window of a minute: a message that waited it out would never reach the model here.
        running_daemon(tmp_path, fake, redis_url, redis_prefix, queue={"debounce_ms": 60000}) as bot,
    ):
        await bot.send("hello")
        await gate.wait_waiting(1, timeout=10.0)
        gate.release()
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        await bot.wait_idle()
        assert bot.channel.texts("part") == ["hello back"]
        assert len(fake.requests) == 1


async def test_a_burst_before_any_output_folds_into_the_running_turn(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    gate = Gate()
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, queue={"debounce_ms": 60000}) as bot,
    ):
        await bot.send("part one")
        await gate.wait_waiting(1)  # the model is already working on the first message
        await bot.send("part two")
        await gate.wait_hung_up(1)  # its call was dropped, nothing of it was shown
        await gate.wait_waiting(1)
        await bot.send("part three")
        await gate.wait_hung_up(2)
        await gate.wait_waiting(1)
        gate.replies.append(Reply.text("all three read"))
        gate.release()
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        await bot.wait_idle()
        assert bot.channel.texts("part") == ["all three read"]
        assert all("all three read".startswith(t) for _, t in bot.channel.previews)  # only the final answer showed
        # Every pass is of a first attempt: none of them looks in the store for a preview.
        assert len(bot.channel.opened) == 3 and not any(resumed for _, resumed in bot.channel.opened)
        assert request_texts(fake.requests[-1]) == ["part one", "part two", "part three"]
        history = await bot.history()
        assert roles(history) == ["user", "user", "user", "assistant"]
        assert [m.content for m in history if m.role == "user"] == ["part one", "part two", "part three"]


async def test_a_message_after_output_started_is_a_turn_of_its_own(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    slow = Reply.text("one two three four five six seven eight", chunk_delay_s=0.2)
    gate = Gate(slow, Reply.text("answer two"))
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(
            tmp_path, fake, redis_url, redis_prefix, queue={"mode": "followup", "debounce_ms": 60000}
        ) as bot,
    ):
        await bot.send("question one")
        gate.release(2)
        await bot.channel.wait_for(lambda ch: ch.previews)  # the first answer is showing
        await bot.send("question two")
        await bot.channel.wait_for(lambda ch: len(ch.texts("part")) == 2)
        await bot.wait_idle()
        assert gate.hung_up == 0
        assert bot.channel.texts("part") == ["one two three four five six seven eight", "answer two"]
        assert request_texts(fake.requests[0]) == ["question one"]
        assert roles(await bot.history()) == ["user", "assistant", "user", "assistant"]


async def test_no_folding_with_a_zero_window(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    gate = Gate(Reply.text("answer one"), Reply.text("answer two"))
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(
            tmp_path, fake, redis_url, redis_prefix, queue={"mode": "followup", "debounce_ms": 0}
        ) as bot,
    ):
        await bot.send("question one")
        await gate.wait_waiting(1)
        await bot.send("question two")
        gate.release(2)
        await bot.channel.wait_for(lambda ch: len(ch.texts("part")) == 2)
        await bot.wait_idle()
        assert gate.hung_up == 0
        assert bot.channel.texts("part") == ["answer one", "answer two"]
        assert request_texts(fake.requests[0]) == ["question one"]


async def test_steer_mode_runs_a_message_that_missed_the_last_llm_call(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    gate = Gate(Reply.text("answer one"), Reply.text("answer two"))
    async with (
        FakeOpenAI(responder=gate) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, queue={"mode": "steer"}) as bot,
    ):
        await bot.send("question one")
        await gate.wait_waiting(1)  # the last LLM call of this run: nothing can be steered into it
        await bot.send("question two")
        gate.release(2)
        await bot.channel.wait_for(lambda ch: len(ch.texts("part")) == 2)
        await bot.wait_idle()
        assert bot.channel.texts("part") == ["answer one", "answer two"]
        assert request_texts(fake.requests[0]) == ["question one"]
        assert request_texts(fake.requests[1]) == ["question one", "question two"]
        assert roles(await bot.history()) == ["user", "assistant", "user", "assistant"]


async def test_a_message_that_lands_while_the_last_finish_is_in_flight_is_served(
    tmp_path: Path, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last finish releases the lock in Redis; a message submitted before its reply is
    back sees the lock free and kicks the session while the old worker still runs. That kick
    must start a new worker: nothing else would serve the message (the sweeper is off here;
    in production it would wait for the sweeper's next pass, a second or more)."""
    monkeypatch.setattr(worker, "SWEEP_INTERVAL_S", 3600.0)
    monkeypatch.setattr(worker, "QUIET_SWEEP_INTERVAL_S", 3600.0)
    async with (
        FakeOpenAI() as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot,
    ):
        fake.script(Reply.text("answer one"), Reply.text("answer two"))
        inbox = bot.gateway.inbox
        finish = inbox.finish
        submitted: list[str] = []

        async def finish_then_a_message(*args: Any, **kwargs: Any) -> bool:
            more = await finish(*args, **kwargs)
            if not submitted:  # the lock is free in Redis; the finishing worker has not seen it yet
                submitted.append((await bot.send("question two")).status)
            return more

        monkeypatch.setattr(inbox, "finish", finish_then_a_message)
        await bot.send("question one")
        await bot.channel.wait_for(lambda ch: len(ch.texts("part")) == 2, timeout=10)
        assert submitted == ["queued"]
        assert bot.channel.texts("part") == ["answer one", "answer two"]
