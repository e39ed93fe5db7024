"""Compaction end to end: real Redis, the real OpenAI client against the fake server, real file tools."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from agent.compaction import FLUSH_TASK, memory_flush
from agent.history import SUMMARY_ACK, SUMMARY_HEADER, prepare_history, repair_pairing
from agent.llm import LLMClient
from agent.tools.files import ReadFileTool, WriteFileTool
from agent.tools.registry import ToolContext, ToolRegistry, ToolSettings
from agent.types import Message, ToolCall
from bot.compactor import SessionCompactor, compaction_lock_key
from bot.config import AgentConfig, BotdConfig
from bot.store import Keys, SessionStore
from tests.fakes.openai_server import Call, FakeOpenAI, Reply

SK = "agent:main:telegram:dm:42"
WINDOW = 128_000


@pytest.fixture
async def llm(fake: FakeOpenAI) -> AsyncIterator[LLMClient]:
    client = LLMClient(model="gpt-4o-mini", base_url=fake.base_url, api_key="test", max_retries=0)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    (ws / "SOUL.md").write_text("You are calm.\n")
    return ws


@pytest.fixture
def settings(workspace: Path) -> ToolSettings:
    return ToolSettings(workspace=workspace, allowed_paths=(workspace,))


@pytest.fixture
def keys(redis_prefix: str) -> Keys:
    return Keys(redis_prefix)


@pytest.fixture
def sessions(redis_client: aioredis.Redis, keys: Keys) -> SessionStore:
    return SessionStore(redis_client, keys)


@pytest.fixture
def compactor(
    sessions: SessionStore,
    redis_client: aioredis.Redis,
    redis_prefix: str,
    llm: LLMClient,
    settings: ToolSettings,
    workspace: Path,
) -> SessionCompactor:
    cfg = BotdConfig(agent=AgentConfig(workspace=workspace))
    cfg.llm.context_window = WINDOW
    return SessionCompactor(sessions, redis_client, redis_prefix, llm, settings, cfg)


def chat(n: int) -> list[Message]:
    return [
        Message.user(f"question {i}") if i % 2 == 0 else Message.assistant(f"answer {i}") for i in range(n)
    ]


async def store(sessions: SessionStore, messages: list[Message]) -> None:
    assert await sessions.append(SK, "run-1", messages)


def tool_names(request: dict[str, Any]) -> list[str]:
    return sorted(t["function"]["name"] for t in request.get("tools") or [])


async def gated(fake: FakeOpenAI, gate: asyncio.Event, summary: str = "- gated summary") -> None:
    """Flush requests (they carry tools) answer NO_REPLY at once; the summary waits for ``gate``."""

    async def respond(body: dict[str, Any]) -> Reply:
        if body.get("tools"):
            return Reply.text("NO_REPLY")
        await gate.wait()
        return Reply.text(summary)

    fake.responder = respond


# -- the trigger -------------------------------------------------------------------


async def test_fifty_messages_and_few_tokens_are_left_alone(
    compactor: SessionCompactor, sessions: SessionStore, fake: FakeOpenAI
) -> None:
    await store(sessions, chat(50))
    assert not await compactor.maybe_compact(SK, 1_000)
    assert fake.requests == []
    assert len(await sessions.history(SK)) == 50


async def test_fifty_one_messages_compact_to_a_summary_and_the_last_four(
    compactor: SessionCompactor, sessions: SessionStore, fake: FakeOpenAI, llm: LLMClient
) -> None:
    history = chat(51)
    await store(sessions, history)
    fake.script(
        Reply.text("NO_REPLY"), Reply.text("- The user asked 51 questions.\n- Prefers short answers.")
    )

    assert await compactor.maybe_compact(SK, 1_000)

    kept = await sessions.history(SK)
    assert kept == history[-4:]
    summary = await sessions.summary(SK)
    assert summary == "- The user asked 51 questions.\n- Prefers short answers."
    assert await sessions.compaction_count(SK) == 1

    flush, summarize = fake.requests
    assert tool_names(flush) == ["read_file", "write_file"]
    assert flush["messages"][0]["role"] == "system" and FLUSH_TASK in flush["messages"][0]["content"]
    assert "Memory" not in flush["messages"][0]["content"].split("## Task")[0]  # minimal prompt
    assert "tools" not in summarize
    transcript = summarize["messages"][-1]["content"]
    assert "question 0" in transcript and "answer 45" in transcript
    assert "question 48" not in transcript  # kept verbatim, not summarized

    # The next request starts with the summary as a user/assistant pair.
    prepared = prepare_history(kept, history_turns=50, context_window_tokens=WINDOW, summary=summary)
    assert prepared[0] == Message.user(f"{SUMMARY_HEADER}\n{summary}")
    assert prepared[1] == Message.assistant(SUMMARY_ACK)
    assert prepared[2:] == kept
    fake.script(Reply.text("ok"))
    await llm.complete([Message.system("sys"), *prepared, Message.user("next")], None)
    sent = fake.requests[-1]["messages"]
    assert sent[1]["role"] == "user" and sent[1]["content"].startswith(SUMMARY_HEADER)
    assert sent[2] == {"role": "assistant", "content": SUMMARY_ACK}


async def test_prompt_tokens_over_three_quarters_of_the_window_trigger(
    compactor: SessionCompactor, sessions: SessionStore, fake: FakeOpenAI
) -> None:
    history = chat(6)
    await store(sessions, history)
    assert not await compactor.maybe_compact(SK, WINDOW * 3 // 4)
    assert fake.requests == []

    fake.script(Reply.text("NO_REPLY"), Reply.text("- short summary"))
    assert await compactor.maybe_compact(SK, WINDOW * 3 // 4 + 1)
    assert await sessions.history(SK) == history[-4:]
    assert await sessions.summary(SK) == "- short summary"


async def test_kept_tail_starts_at_the_assistant_that_made_the_calls(
    compactor: SessionCompactor, sessions: SessionStore, fake: FakeOpenAI
) -> None:
    calls = [
        ToolCall(id=f"c{i}", name="read_file", arguments=json.dumps({"path": f"f{i}"})) for i in range(3)
    ]
    history = [
        *chat(45),
        Message.user("read the three files"),
        Message.assistant(None, calls),
        *(Message.tool(f"c{i}", f"content {i}") for i in range(3)),
        Message.assistant("All three are read."),
    ]
    assert len(history) == 51
    await store(sessions, history)
    fake.script(Reply.text("NO_REPLY"), Reply.text("- summary"))

    assert await compactor.maybe_compact(SK, 0)

    kept = await sessions.history(SK)
    assert kept == history[46:]
    assert kept[0].tool_calls == calls
    assert repair_pairing(kept) == kept


async def test_second_compaction_merges_the_previous_summary(
    compactor: SessionCompactor, sessions: SessionStore, fake: FakeOpenAI
) -> None:
    await store(sessions, chat(51))
    fake.script(Reply.text("NO_REPLY"), Reply.text("- first summary: likes tea"))
    assert await compactor.maybe_compact(SK, 0)
    assert await sessions.append(SK, "run-2", chat(48))
    fake.script(Reply.text("NO_REPLY"), Reply.text("- merged: likes tea, asked more"))

    assert await compactor.maybe_compact(SK, 0)

    flush, summarize = fake.requests[2:]
    assert "first summary: likes tea" in flush["messages"][1]["content"]  # the flush sees it too
    assert "<<<PREVIOUS SUMMARY>>>\n- first summary: likes tea" in summarize["messages"][-1]["content"]
    assert await sessions.summary(SK) == "- merged: likes tea, asked more"
    assert await sessions.compaction_count(SK) == 2


# -- the memory flush ---------------------------------------------------------------


async def test_flush_writes_memory_and_its_messages_stay_out_of_the_session(
    compactor: SessionCompactor, sessions: SessionStore, fake: FakeOpenAI, workspace: Path
) -> None:
    history = [Message.user("Remember: my cat is called Miso."), Message.assistant("Noted!"), *chat(49)]
    await store(sessions, history)
    fake.script(
        Reply.tool_calls(
            [Call("write_file", {"path": "MEMORY.md", "content": "- The user's cat is Miso.\n"})]
        ),
        Reply.text("NO_REPLY"),
        Reply.text("- The user has a cat."),
    )

    assert await compactor.maybe_compact(SK, 0)

    assert (workspace / "MEMORY.md").read_text() == "- The user's cat is Miso.\n"
    tool_result = fake.requests[1]["messages"][-1]
    assert tool_result["role"] == "tool" and tool_result["content"].startswith("Wrote ")
    kept = await sessions.history(SK)
    assert kept == history[-4:]
    assert not any(m.tool_calls for m in kept)


def flush_ctx(settings: ToolSettings) -> ToolContext:
    return ToolContext(run_id="flush-test", session_key=SK, settings=settings)


async def test_flush_is_confined_to_the_memory_files(
    fake: FakeOpenAI, llm: LLMClient, settings: ToolSettings, workspace: Path, tmp_path: Path
) -> None:
    (workspace / "memory").mkdir()
    (workspace / "memory" / "link.md").symlink_to(workspace / "SOUL.md")
    attempts = [
        ("write_file", {"path": "notes.txt", "content": "x"}),
        ("write_file", {"path": "SOUL.md", "content": "You are evil."}),
        ("write_file", {"path": "memory/notes.txt", "content": "x"}),
        ("write_file", {"path": "memory/deep/x.md", "content": "x"}),
        ("write_file", {"path": "../outside.md", "content": "x"}),
        ("write_file", {"path": "memory/link.md", "content": "You are evil."}),
        ("read_file", {"path": "SOUL.md"}),
        ("list_directory", {"path": "."}),
        ("write_file", {"path": "memory/pets.md", "content": "- Miso the cat\n"}),
    ]
    fake.script(Reply.tool_calls([Call(name, args) for name, args in attempts]), Reply.text("NO_REPLY"))
    registry = ToolRegistry([ReadFileTool(), WriteFileTool()])

    result = await memory_flush(
        chat(4),
        model=llm,
        tools=registry,
        ctx=flush_ctx(settings),
        workspace=workspace,
        now=datetime.now(UTC),
    )

    assert result.status == "completed" and result.silent and result.writes == 1
    results = [m for m in fake.requests[1]["messages"] if m["role"] == "tool"]
    assert len(results) == len(attempts)
    assert all(r["content"].startswith("Error") for r in results[:-1])
    assert "outside the allowed paths" in results[0]["content"]  # the path guard's roots
    assert "memory/*.md" in results[2]["content"] and "memory/*.md" in results[3]["content"]  # the wrapper
    assert "unknown tool" in results[7]["content"]
    assert results[-1]["content"].startswith("Wrote ")
    assert (workspace / "memory" / "pets.md").read_text() == "- Miso the cat\n"
    assert (workspace / "SOUL.md").read_text() == "You are calm.\n"
    for absent in (
        workspace / "notes.txt",
        workspace / "memory" / "notes.txt",
        workspace / "memory" / "deep",
        tmp_path / "outside.md",
    ):
        assert not absent.exists()


async def test_flush_with_nothing_to_store_is_silent(
    fake: FakeOpenAI, llm: LLMClient, settings: ToolSettings, workspace: Path
) -> None:
    fake.script(Reply.text("NO_REPLY"))
    result = await memory_flush(
        chat(4),
        model=llm,
        tools=ToolRegistry([ReadFileTool(), WriteFileTool()]),
        ctx=flush_ctx(settings),
        workspace=workspace,
        now=datetime.now(UTC),
    )
    assert result.ok and result.silent and result.writes == 0 and result.iterations == 1
    assert fake.requests[0]["messages"][-1]["role"] == "user"
    assert not (workspace / "MEMORY.md").exists()


async def test_flush_stops_after_five_iterations(
    fake: FakeOpenAI, llm: LLMClient, settings: ToolSettings, workspace: Path
) -> None:
    fake.responder = lambda body: (
        Reply.tool_calls([Call("read_file", {"path": "MEMORY.md"})])
        if body.get("tools")
        else Reply.text("gave up")
    )
    result = await memory_flush(
        chat(4),
        model=llm,
        tools=ToolRegistry([ReadFileTool(), WriteFileTool()]),
        ctx=flush_ctx(settings),
        workspace=workspace,
        now=datetime.now(UTC),
    )
    assert result.status == "max_iterations"
    assert sum(1 for r in fake.requests if r.get("tools")) == 5


async def test_flush_timeout_is_a_result_not_an_exception(
    fake: FakeOpenAI, llm: LLMClient, settings: ToolSettings, workspace: Path
) -> None:
    never = asyncio.Event()

    async def hang(body: dict[str, Any]) -> Reply:
        await never.wait()
        return Reply.text("too late")

    fake.responder = hang
    try:
        result = await memory_flush(
            chat(4),
            model=llm,
            tools=ToolRegistry([ReadFileTool(), WriteFileTool()]),
            ctx=flush_ctx(settings),
            workspace=workspace,
            now=datetime.now(UTC),
            timeout_s=0.3,
        )
    finally:
        never.set()
    assert result.status == "timeout" and not result.ok and result.error


# -- failures leave the session alone ------------------------------------------------


@pytest.mark.parametrize(
    "replies",
    [
        [Reply.text("NO_REPLY"), Reply.error(500)],  # the summary call fails
        [Reply.error(500), Reply.error(500)],  # everything fails
        [Reply.text("NO_REPLY"), Reply.text("   ")],  # an empty summary
        [Reply.text("NO_REPLY"), Reply.text("NO_REPLY")],  # a refusal to summarize
    ],
    ids=["summary-500", "all-500", "empty-summary", "silent-summary"],
)
async def test_failed_summary_leaves_history_untouched(
    compactor: SessionCompactor, sessions: SessionStore, fake: FakeOpenAI, replies: list[Reply]
) -> None:
    history = chat(51)
    await store(sessions, history)
    fake.script(*replies)

    assert not await compactor.maybe_compact(SK, 0)

    assert await sessions.history(SK) == history
    assert await sessions.summary(SK) is None
    assert await sessions.compaction_count(SK) == 0
    assert len(fake.requests) == 2


async def test_failed_flush_does_not_stop_the_summary(
    compactor: SessionCompactor, sessions: SessionStore, fake: FakeOpenAI
) -> None:
    history = chat(51)
    await store(sessions, history)
    fake.script(Reply.error(500), Reply.text("- summary despite the flush"))

    assert await compactor.maybe_compact(SK, 0)
    assert await sessions.history(SK) == history[-4:]
    assert await sessions.summary(SK) == "- summary despite the flush"


# -- concurrency --------------------------------------------------------------------


async def test_one_compaction_per_session_at_a_time(
    compactor: SessionCompactor,
    sessions: SessionStore,
    fake: FakeOpenAI,
    redis_client: aioredis.Redis,
    keys: Keys,
) -> None:
    history = chat(51)
    await store(sessions, history)
    gate = asyncio.Event()
    await gated(fake, gate)

    first = asyncio.create_task(compactor.maybe_compact(SK, 0))
    await fake.wait_for_requests(2)  # the flush is done, the summary is waiting
    lock = compaction_lock_key(keys, SK)
    assert lock == f"{keys.prefix}:compaction:{SK}"
    assert await redis_client.pttl(lock) > 240_000
    assert not await compactor.maybe_compact(SK, 0)  # skipped: the lock is held
    gate.set()

    assert await first
    assert len(fake.requests) == 2
    assert await sessions.compaction_count(SK) == 1
    assert await sessions.history(SK) == history[-4:]
    assert not await redis_client.exists(lock)
    assert not await compactor.maybe_compact(SK, 0)  # four messages: no longer due
    assert len(fake.requests) == 2


async def test_simultaneous_calls_compact_once(
    compactor: SessionCompactor, sessions: SessionStore, fake: FakeOpenAI
) -> None:
    await store(sessions, chat(51))
    fake.responder = lambda body: Reply.text("NO_REPLY" if body.get("tools") else "- once")

    outcomes = await asyncio.gather(*(compactor.maybe_compact(SK, 0) for _ in range(3)))

    assert sorted(outcomes) == [False, False, True]
    assert await sessions.compaction_count(SK) == 1
    assert len(fake.requests) == 2


async def test_a_lock_held_elsewhere_skips_without_calling_the_model(
    compactor: SessionCompactor,
    sessions: SessionStore,
    fake: FakeOpenAI,
    redis_client: aioredis.Redis,
    keys: Keys,
) -> None:
    history = chat(51)
    await store(sessions, history)
    await redis_client.set(compaction_lock_key(keys, SK), "another-replica", ex=300)

    assert not await compactor.maybe_compact(SK, 0)
    assert fake.requests == []
    assert await sessions.history(SK) == history
    assert await redis_client.get(compaction_lock_key(keys, SK)) == "another-replica"


async def test_an_append_during_compaction_makes_the_replace_refuse(
    compactor: SessionCompactor, sessions: SessionStore, fake: FakeOpenAI
) -> None:
    history = chat(51)
    await store(sessions, history)
    gate = asyncio.Event()
    await gated(fake, gate)

    task = asyncio.create_task(compactor.maybe_compact(SK, 0))
    await fake.wait_for_requests(2)
    late = [Message.user("one more thing"), Message.assistant("sure")]
    assert await sessions.append(SK, "run-2", late)
    gate.set()

    assert not await task
    assert await sessions.history(SK) == history + late
    assert await sessions.summary(SK) is None
    assert await sessions.compaction_count(SK) == 0


async def test_the_flush_sees_the_newest_messages_that_fit_the_window(
    fake: FakeOpenAI, llm: LLMClient, settings: ToolSettings, workspace: Path
) -> None:
    from agent.compaction import compact

    history = [
        Message.user(f"old fact {i} " + "x" * 4000) if i % 2 == 0 else Message.assistant(f"noted {i}")
        for i in range(20)
    ] + [Message.user("the newest fact"), Message.assistant("noted")]
    fake.script(Reply.text("NO_REPLY"), Reply.text("- summary"))

    result = await compact(
        history, model=llm, tools=ToolRegistry([ReadFileTool(), WriteFileTool()]), ctx=flush_ctx(settings),
        workspace=workspace, now=datetime.now(UTC), previous_summary="- earlier", context_window_tokens=4096,
    )

    assert result.flushed and result.summary == "- summary"
    flush = fake.requests[0]["messages"]
    text = json.dumps(flush)
    assert len(text) // 4 < 4096  # the flush request itself fits the window
    assert "- earlier" in flush[1]["content"]  # the previous summary stays in view
    assert "the newest fact" in text and "old fact 0 " not in text
    assert "old fact 0 " in fake.requests[1]["messages"][-1]["content"]  # the summary still covers it
