"""Cut, empty and odd model answers through the whole gateway: what the chat shows,
what history holds, what the trace and metrics record."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import notices
from bot import metrics
from bot.tracing import Trace
from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.integration.gateway_harness import Bot, assert_valid_history, roles, running_daemon


async def finished(bot: Bot) -> None:
    await bot.channel.wait_for(lambda ch: ch.texts("part") or ch.texts("notice"))
    await bot.wait_idle()


async def trace_of(bot: Bot) -> Trace:
    """The trace of the test's only run."""
    [run_id] = await bot.app.traces.recent()
    trace = await bot.app.traces.load(run_id)
    assert trace is not None
    return trace


async def test_a_cut_answer_is_replaced_by_a_notice_and_not_stored(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        fake.script(Reply.truncated(5, text="Hello! This answer never ends properly"))
        await bot.send("tell me a story")
        await finished(bot)
        assert bot.channel.texts("part") == []
        [notice] = bot.channel.texts("notice")
        assert notice.startswith(notices.FAILURE_PREFIX) and "midway" in notice
        assert "finish_reason" not in notice
        assert [(m.role, m.content) for m in await bot.history()] == [("user", "tell me a story")]
        trace = await trace_of(bot)
        assert trace.status == "failed" and "incomplete" in (trace.error or "")
        assert len(fake.requests) == 1  # text had streamed out: no second answer


async def test_a_write_from_a_cut_stream_never_happens(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    write = Call("write_file", {"path": "pwned.txt", "content": "x"}, id="w1")
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        fake.script(Reply.tool_calls([write], args_as="whole", omit_finish_reason=True), Reply.text("I wrote nothing."))
        await bot.send("write it")
        await finished(bot)
        assert not (tmp_path / "workspace" / "pwned.txt").exists()
        assert bot.channel.texts("part") == ["I wrote nothing."]
        history = await bot.history()
        assert roles(history) == ["user", "assistant"]
        assert len(fake.requests) == 2  # nothing had reached the chat: retried


async def test_no_answer_twice_is_told_not_silent(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        fake.script(Reply.html(), Reply.truncated(0, done=True, text=""))
        await bot.send("hello?")
        await finished(bot)
        [notice] = bot.channel.texts("notice")
        assert "answered with nothing" in notice
        assert roles(await bot.history()) == ["user"]
        assert len(fake.requests) == 2


@pytest.mark.parametrize(("reason", "notice"), [("length", notices.LENGTH), ("content_filter", notices.CONTENT_FILTER)])
async def test_an_answer_stopped_early_is_shown_with_its_notice(
    tmp_path: Path, redis_url: str, redis_prefix: str, reason: str, notice: str
) -> None:
    before = metrics.LLM_PROBLEMS.labels(reason)._value.get()
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        fake.script(Reply.text("The first half of", finish_reason=reason))
        await bot.send("explain everything")
        await finished(bot)
        assert bot.channel.texts("part") == [f"The first half of\n\n{notice}"]
        history = await bot.history()
        assert [(m.role, m.content) for m in history] == [("user", "explain everything"), ("assistant", "The first half of")]
        trace = await trace_of(bot)
        [span] = [s for s in trace.spans if s.kind == "llm"]
        assert span.attrs["finish_reason"] == reason
    assert metrics.LLM_PROBLEMS.labels(reason)._value.get() == before + 1


@pytest.mark.parametrize(
    ("reply", "told", "operator"),
    [
        (Reply.error(401, message="Incorrect API key provided."), notices.OPERATOR_TOLD, "check llm.api_key"),
        (Reply.error(404), notices.OPERATOR_TOLD, "check llm.base_url"),
        (Reply.error(400, message="This model's maximum context length is 8192 tokens."), "/new", "maximum context"),
        (Reply.error(429, retry_after=60), "wait about 60 s", "HTTP 429"),
    ],
    ids=["401", "404", "context", "429-60s"],
)
async def test_failures_speak_to_the_user_and_the_operator_gets_the_detail(
    tmp_path: Path, redis_url: str, redis_prefix: str, reply: Reply, told: str, operator: str
) -> None:
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        fake.script(reply)
        await bot.send("hi")
        await finished(bot)
        [notice] = bot.channel.texts("notice")
        assert told in notice
        assert "llm." not in notice and "HTTP" not in notice and ".)." not in notice
        trace = await trace_of(bot)
        assert operator in (trace.error or "")
        [span] = [s for s in trace.spans if s.kind == "llm"]
        assert operator in (span.error or "")
        assert_valid_history(await bot.history())


async def test_status_shows_allowed_users_the_detail_of_a_failed_last_run(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        fake.script(Reply.error(401, message="Incorrect API key provided."))
        await bot.send("hi")
        await finished(bot)
        await bot.send("/status")
        status = bot.channel.texts("notice")[-1]
        assert "Last run failed: auth:" in status and "check llm.api_key" in status

        fake.script(Reply.text("all good now"))
        await bot.send("again")
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        await bot.wait_idle()
        await bot.send("/status")
        assert "Last run" not in bot.channel.texts("notice")[-1]
