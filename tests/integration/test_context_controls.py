"""Context under the user's control, end to end in one daemon: the pre-flight budget,
/compact, /model and /usage, against the fake OpenAI server and a real Redis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent import notices
from agent.compaction import FLUSH_TASK
from agent.history import SUMMARY_HEADER
from agent.types import Message
from channels.base import UNLISTED
from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.integration.gateway_harness import (
    Bot,
    Gate,
    chat_request,
    dm_session,
    request_texts,
    running_daemon,
)

WINDOW = 16_000


def is_flush(body: dict[str, Any]) -> bool:
    return FLUSH_TASK in str(body["messages"][0].get("content") or "")


def is_summary(body: dict[str, Any]) -> bool:
    return not body.get("tools") and "<<<CONVERSATION>>>" in str(body["messages"][-1].get("content") or "")


def chat_requests(fake: FakeOpenAI) -> list[dict[str, Any]]:
    """The requests that answered the chat (not a memory flush, not a summary)."""
    return [r for r in fake.requests if not is_flush(r) and not is_summary(r)]


class Model:
    """A responder: flushes store nothing, summaries are fixed, chat turns answer with scripted usage."""

    def __init__(self, summary: str = "- The user talked about cats.") -> None:
        self.summary = summary
        self.usage: list[dict[str, int]] = []  # for the next chat answers, in order

    def __call__(self, body: dict[str, Any]) -> Reply:
        if is_flush(body):
            return Reply.text("NO_REPLY")
        if is_summary(body):
            return Reply.text(self.summary)
        last = request_texts(body)[-1]
        usage: dict[str, int] | bool = self.usage.pop(0) if self.usage else True
        return Reply.text(f"answer to {last[:20]}", usage=usage)


async def say(bot: Bot, text: str, answers: int) -> None:
    """Send ``text`` and wait for the session's ``answers``-th reply part and idleness."""
    await bot.send(text)
    await bot.channel.wait_for(lambda ch: len(ch.texts("part")) >= answers)
    await bot.wait_idle()


async def notice(bot: Bot, starts: str) -> str:
    await bot.channel.wait_for(lambda ch: any(t.startswith(starts) for t in ch.texts("notice")))
    return next(t for t in bot.channel.texts("notice") if t.startswith(starts))


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


# -- the pre-flight budget ---------------------------------------------------------------


async def test_a_request_over_95_percent_compacts_before_the_call_and_keeps_answering(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    model = Model()
    async with (
        FakeOpenAI(responder=model) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, llm={"context_window": WINDOW}) as bot,
    ):
        # The first exchange reports 62 % of the window: under every trigger.
        model.usage = [usage(10_000, 100)]
        await say(bot, "I have a cat called Miso.", 1)
        assert await bot.sessions.compaction_count(dm_session()) == 0
        # The next message adds about 5,000 tokens: 10,100 + 5,000 is over 95 %.
        big = "Please read this carefully. " + "lorem ipsum " * 1700
        model.usage = [usage(6_000, 50)]
        await say(bot, big, 2)

        flush, summary, answer = fake.requests[-3:]
        assert is_flush(flush) and is_summary(summary)
        assert "I have a cat called Miso." in summary["messages"][-1]["content"]
        sent = [m.get("content") for m in answer["messages"]]
        assert str(sent[1]).startswith(SUMMARY_HEADER)  # the request starts with the summary
        assert str(sent[-1]).strip() == big.strip()
        assert bot.channel.texts("part")[-1] == f"answer to {big.strip()[:20]}"
        assert await bot.sessions.compaction_count(dm_session()) == 1
        assert await bot.sessions.summary(dm_session()) == model.summary

        # And the conversation goes on from there.
        await say(bot, "What is my cat called?", 3)
        follow_up = chat_requests(fake)[-1]
        assert str(follow_up["messages"][1]["content"]).startswith(SUMMARY_HEADER)
        assert bot.channel.texts("notice") == []


async def test_a_request_that_cannot_fit_ends_with_a_notice_not_a_provider_error(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with (
        FakeOpenAI(responder=Model()) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, llm={"context_window": 4096}) as bot,
    ):
        await bot.send("word " * 6000)  # about 7,500 tokens for a window of 4,096
        text = await notice(bot, "Sorry")
        await bot.wait_idle()
        assert text == notices.CONTEXT_FULL and "/new" in text and "/compact" in text
        assert chat_requests(fake) == []  # the oversized request was never sent
        assert bot.channel.texts("part") == []


async def test_at_80_percent_the_reply_says_so_once_until_it_drops(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    model = Model()
    async with (
        FakeOpenAI(responder=model) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, llm={"context_window": 100_000}) as bot,
    ):
        model.usage = [usage(81_000, 500), usage(81_500, 500), usage(2_000, 10), usage(82_000, 10)]
        for i in range(4):
            await say(bot, f"message {i}", i + 1)
        parts = bot.channel.texts("part")
        warned = [p for p in parts if "Context 81% full" in p or "Context 82% full" in p]
        assert parts[0].startswith("answer to message 0\n\n(Context 81% full")
        assert "/compact" in parts[0] and "/new" in parts[0]
        assert parts[1] == "answer to message 1" and parts[2] == "answer to message 2"
        assert parts[3].startswith("answer to message 3\n\n(Context 82% full")
        assert len(warned) == 2
        # The notice is for the chat only; the stored answer is the model's.
        stored = [m.content or "" for m in await bot.history() if m.role == "assistant"]
        assert stored and not any("Context" in text for text in stored)
        assert len(chat_requests(fake)) == 4


# -- /compact ------------------------------------------------------------------------------


async def test_compact_shrinks_a_long_session_and_the_next_request_starts_with_the_summary(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    model = Model(summary="- Miso is the cat; the user prefers short answers.")
    async with (
        FakeOpenAI(responder=model) as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, llm={"context_window": WINDOW}) as bot,
    ):
        long = [Message.user(f"question {i} " + "about cats " * 40) if i % 2 == 0 else Message.assistant(f"answer {i}")
                for i in range(30)]
        await bot.sessions.append(dm_session(), "seed", long)

        await bot.send("/compact the cat's name")
        assert await notice(bot, "Compacting") == "Compacting this conversation…"
        text = await notice(bot, "Compacted")
        assert text.startswith("Compacted: 30 message(s), about ")
        assert "→ a summary and 4 message(s)" in text and f"of {WINDOW:,})" in text
        summary_request = next(r for r in fake.requests if is_summary(r))
        assert "<<<FOCUS>>>\nthe cat's name\n<<<END FOCUS>>>" in summary_request["messages"][-1]["content"]
        assert await bot.history() == long[-4:]
        assert await bot.sessions.summary(dm_session()) == model.summary

        await say(bot, "and now?", 1)
        first = chat_requests(fake)[-1]["messages"]
        assert first[0]["role"] == "system"
        assert first[1] == {"role": "user", "content": f"{SUMMARY_HEADER}\n{model.summary}"}
        assert first[-1] == {"role": "user", "content": "and now?"}


async def test_compact_is_refused_while_a_run_is_active(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        await bot.sessions.append(dm_session(), "seed", [Message.user(f"m{i}") for i in range(10)])
        gate = Gate(Reply.text("done"))
        fake.responder = gate
        await bot.send("a slow question")
        await gate.wait_waiting(1)
        await bot.send("/compact")
        text = await notice(bot, "A reply is in progress")
        assert "/stop" in text
        gate.release()
        await bot.wait_idle()
        assert await bot.sessions.compaction_count(dm_session()) == 0
        assert len(fake.requests) == 1


async def test_compact_with_nothing_to_compact_says_so(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        await bot.sessions.append(dm_session(), "seed", [Message.user("hi"), Message.assistant("hello")])
        await bot.send("/compact")
        assert (await notice(bot, "Nothing to compact")).startswith("Nothing to compact yet: 2 message(s)")
        assert bot.channel.texts("notice")[0] == "Compacting this conversation…"  # always first
        assert fake.requests == []
        await bot.wait_idle()


async def test_messages_sent_during_a_compaction_wait_for_it(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    gate = Gate()
    model = Model()

    async def respond(body: dict[str, Any]) -> Reply:
        if is_summary(body):
            await gate(body)  # hold the summary until released
        return model(body)

    async with FakeOpenAI(responder=respond) as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        await bot.sessions.append(dm_session(), "seed", [Message.user(f"m{i}") for i in range(10)])
        await bot.send("/compact")
        await gate.wait_waiting(1)
        await bot.send("/compact")
        assert "compacted already" in await notice(bot, "This conversation is being compacted")
        await bot.send("while compacting")
        gate.release()
        await notice(bot, "Compacted")
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        await bot.wait_idle()
        answer = chat_requests(fake)[-1]["messages"]
        assert str(answer[1]["content"]).startswith(SUMMARY_HEADER)  # it ran on the compacted session
        assert answer[-1]["content"] == "while compacting"


# -- /model --------------------------------------------------------------------------------


async def test_model_lists_switches_and_the_run_uses_that_models_id_endpoint_and_cap(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as fake, FakeOpenAI() as other:
        models = {
            "big": {"context_window": 200_000, "max_output_tokens": 8192},
            "elsewhere": {"base_url": other.base_url, "api_key": "other-key"},
        }
        async with running_daemon(
            tmp_path, fake, redis_url, redis_prefix, llm={"model": "small", "models": models}
        ) as bot:
            await bot.send("/model")
            listing = await notice(bot, "Models")
            assert "• small (128,000 tokens of context) — current" in listing
            assert "• big (200,000 tokens of context)" in listing and "• elsewhere" in listing

            await bot.send("/model gpt-5-turbo")
            refused = await notice(bot, "Unknown model")
            assert "small, big, elsewhere" in refused

            await bot.send("/model big")
            assert "now uses big" in await notice(bot, "This conversation now uses")
            await say(bot, "hello big", 1)
            assert fake.requests[-1]["model"] == "big" and fake.requests[-1]["max_tokens"] == 8192

            await bot.send("/status")
            assert (await notice(bot, "Model:")).startswith("Model: big\n")

            await bot.send("/model elsewhere")
            await notice(bot, "This conversation now uses elsewhere")
            await say(bot, "hello elsewhere", 2)
            assert other.requests[-1]["model"] == "elsewhere"
            assert other.request_headers[-1]["Authorization"] == "Bearer other-key"
            assert len(fake.requests) == 1

            # Another chat still has the default.
            await bot.send("hi", chat_id="200")
            await bot.channel.wait_for(lambda ch: len(ch.texts("part")) >= 3)
            assert fake.requests[-1]["model"] == "small"


async def test_an_unlisted_group_member_may_list_but_not_switch_the_model(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as fake, running_daemon(
        tmp_path, fake, redis_url, redis_prefix, llm={"models": {"gpt-4o": {}}}
    ) as bot:
        req = chat_request("/model gpt-4o")
        await bot.submit(req.model_copy(update={"meta": {UNLISTED: "1"}}))
        assert "Only the bot's listed users" in await notice(bot, "Only")
        assert await bot.sessions.model(dm_session()) is None
        listing = chat_request("/model")
        await bot.submit(listing.model_copy(update={"meta": {UNLISTED: "1"}}))
        assert "gpt-4o" in await notice(bot, "Models")


# -- /usage --------------------------------------------------------------------------------


async def test_usage_matches_the_models_usage_chunks_and_prices_them(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    price = {"prompt_per_mtok": 2.0, "completion_per_mtok": 10.0}
    async with (
        FakeOpenAI() as fake,
        running_daemon(
            tmp_path, fake, redis_url, redis_prefix, llm={"context_window": 100_000, "price": price}
        ) as bot,
    ):
        fake.script(Reply.text("first", usage=usage(1_234, 56)))
        await say(bot, "one", 1)
        fake.script(
            Reply.tool_calls([Call("list_directory", {"path": "."})], usage=usage(2_000, 20)),
            Reply.text("second", usage=usage(2_500, 30)),
        )
        await say(bot, "two", 2)

        await bot.send("/usage")
        text = await notice(bot, "Model:")
        lines = text.splitlines()
        assert lines[1] == "Last run: 4,500 prompt + 50 completion tokens"
        assert lines[2] == "Total: 5,734 prompt + 106 completion tokens"
        assert lines[3] == "Context: about 2,530 of 100,000 tokens (3%)"
        assert lines[4] == "Compactions: 0"
        last_cost = (4_500 * 2 + 50 * 10) / 1e6
        total_cost = (5_734 * 2 + 106 * 10) / 1e6
        assert lines[5] == f"Cost: {last_cost:.4f} last run, {total_cost:.4f} total"
