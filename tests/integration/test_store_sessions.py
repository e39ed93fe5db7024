"""SessionStore against a real Redis: atomic idempotent appends, compaction, reset, listing, usage."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.types import Message, ToolCall
from bot.store import Keys, SessionStore
from tests.fakes.lost_replies import LostReplies

SK = "agent:main:telegram:dm:42"


@pytest.fixture
def keys(redis_prefix: str) -> Keys:
    return Keys(redis_prefix)


@pytest.fixture
def store(redis_client: aioredis.Redis, keys: Keys) -> SessionStore:
    return SessionStore(redis_client, keys)


def every_shape() -> list[Message]:
    return [
        Message.system("You are botd."),
        Message(role="user", content='hi ✨ — «quotes» "and" \\ backslashes\nnew line', name="alice"),
        Message.assistant(
            None,
            [
                ToolCall(id="call_1", name="bash", arguments='{"cmd": "ls -la"}'),
                ToolCall(id="call_2", name="read_file", arguments='{"path": "ünï.txt"}'),
                ToolCall(id="call_3", name="noargs", arguments=""),
            ],
        ),
        Message.tool("call_1", "total 0\n"),
        Message.tool("call_2", "ENOENT", is_error=True),
        Message.tool("call_3", ""),
        Message(role="assistant", content="Done.", reasoning="I listed the directory first."),
        Message.user(""),
        Message.assistant("x" * 20000),
    ]


async def test_every_message_shape_round_trips_exactly(store: SessionStore) -> None:
    messages = every_shape()
    assert await store.append(SK, "run-1", messages)
    assert await store.history(SK) == messages


message_strategy = st.builds(
    Message,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=st.none() | st.text(max_size=50),
    tool_calls=st.none()
    | st.lists(
        st.builds(
            ToolCall,
            id=st.text(min_size=1, max_size=8),
            name=st.text(max_size=8),
            arguments=st.text(max_size=30),
        ),
        min_size=1,
        max_size=3,
    ),
    tool_call_id=st.none() | st.text(max_size=8),
    is_error=st.booleans(),
    reasoning=st.none() | st.text(max_size=30),
    name=st.none() | st.text(max_size=8),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(message_strategy, max_size=6))
async def test_any_messages_round_trip(store: SessionStore, messages: list[Message]) -> None:
    run = uuid.uuid4().hex  # the store fixture is shared by all examples: fresh session each time
    key = f"agent:main:prop:{run}"
    assert await store.append(key, run, messages)
    assert await store.history(key) == messages


async def test_append_is_idempotent_per_run(store: SessionStore) -> None:
    first = [Message.user("hello"), Message.assistant("hi")]
    assert await store.append(SK, "run-1", first) is True
    assert await store.append(SK, "run-1", first) is False  # a retry
    assert await store.append(SK, "run-1", [Message.user("other")]) is False
    assert await store.history(SK) == first
    second = [Message.user("again"), Message.assistant("sure")]
    assert await store.append(SK, "run-2", second) is True
    assert await store.history(SK) == first + second
    assert (await store.show(SK)).version == 2


async def test_applied_run_ids_are_bounded(redis_client: aioredis.Redis, keys: Keys) -> None:
    store = SessionStore(redis_client, keys, ops_bound=3)
    for i in range(6):
        await store.append(SK, f"run-{i}", [Message.user(str(i))])
    assert await redis_client.zcard(keys.session_ops(SK)) == 3
    assert await store.append(SK, "run-5", [Message.user("dup")]) is False


async def test_bad_input_writes_nothing(store: SessionStore) -> None:
    await store.append(SK, "run-0", [Message.user("keep me")])
    with pytest.raises(TypeError, match="Message"):
        await store.append(SK, "run-1", [Message.user("a"), {"role": "user", "content": "b"}])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="run_id"):
        await store.append(SK, "", [Message.user("a")])
    with pytest.raises(ValueError, match="session_key"):
        await store.append("", "run-2", [Message.user("a")])
    assert await store.history(SK) == [Message.user("keep me")]
    # The failed run can still be appended later: it was not recorded as applied.
    assert await store.append(SK, "run-1", [Message.user("a")])


async def test_concurrent_appends_keep_each_run_contiguous(store: SessionStore) -> None:
    runs, per_run = 12, 6

    async def one_run(r: int) -> None:
        msgs = [Message.user(f"r{r}:{i}") for i in range(per_run)]
        assert await store.append(SK, f"run-{r}", msgs)

    seen_partial: list[int] = []

    async def reader() -> None:
        for _ in range(30):
            history = await store.history(SK)
            if len(history) % per_run:
                seen_partial.append(len(history))
            await asyncio.sleep(0)

    await asyncio.gather(reader(), *(one_run(r) for r in range(runs)), reader())
    history = await store.history(SK)
    assert len(history) == runs * per_run
    assert not seen_partial, "a reader saw part of a run"
    for block in range(runs):
        texts = [m.content for m in history[block * per_run : (block + 1) * per_run]]
        run = str(texts[0]).split(":")[0]
        assert texts == [f"{run}:{i}" for i in range(per_run)]


async def test_history_is_capped_and_keys_expire_when_idle(redis_client: aioredis.Redis, keys: Keys) -> None:
    store = SessionStore(redis_client, keys, max_messages=5, ttl_s=1000)
    for r in range(3):
        await store.append(SK, f"run-{r}", [Message.user(f"{r}.{i}") for i in range(3)])
    history = await store.history(SK)
    assert [m.content for m in history] == ["1.1", "1.2", "2.0", "2.1", "2.2"]
    info = await store.show(SK)
    assert info.message_count == 5 and info.trimmed == 4
    for key in (keys.session_messages(SK), keys.session_meta(SK), keys.session_ops(SK)):
        assert 0 < await redis_client.ttl(key) <= 1000


async def test_replace_after_compaction_refuses_on_concurrent_change(store: SessionStore) -> None:
    old = [Message.user(f"u{i}") for i in range(6)]
    await store.append(SK, "run-1", old)
    snap = await store.snapshot(SK)
    assert snap.stored_count == 6 and snap.version == 1 and snap.summary is None

    late = [Message.user("late"), Message.assistant("late answer")]
    await store.append(SK, "run-2", late)  # a run finished while the summary was being written
    keep = old[-2:]
    assert not await store.replace_after_compaction(SK, "summary", keep, expected_len=snap.stored_count)
    assert await store.history(SK) == old + late
    assert await store.summary(SK) is None
    assert await store.compaction_count(SK) == 0

    snap = await store.snapshot(SK)
    keep = snap.messages[-4:]
    assert await store.replace_after_compaction(
        SK, "the summary", keep, expected_len=snap.stored_count, expected_version=snap.version
    )
    assert await store.history(SK) == keep
    assert await store.summary(SK) == "the summary"
    assert await store.compaction_count(SK) == 1
    info = await store.show(SK)
    assert info.summary_present and info.compactions == 1 and info.message_count == 4


async def test_replace_after_compaction_checks_the_version(store: SessionStore) -> None:
    await store.append(SK, "run-1", [Message.user("a"), Message.assistant("b")])
    snap = await store.snapshot(SK)
    await store.reset(SK)
    await store.append(SK, "run-2", [Message.user("c"), Message.assistant("d")])  # same length again
    refused = await store.replace_after_compaction(
        SK, "s", [], expected_len=snap.stored_count, expected_version=snap.version
    )
    assert not refused
    assert [m.content for m in await store.history(SK)] == ["c", "d"]


async def test_replace_after_compaction_rejects_bad_input(store: SessionStore) -> None:
    await store.append(SK, "run-1", [Message.user("a")])
    with pytest.raises(ValueError, match="summary"):
        await store.replace_after_compaction(SK, "  ", [], expected_len=1)
    with pytest.raises(ValueError, match="expected_len"):
        await store.replace_after_compaction(SK, "s", [], expected_len=-1)
    assert await store.history(SK) == [Message.user("a")]


async def test_reset_clears_history_and_summary_and_counts(store: SessionStore) -> None:
    assert await store.reset(SK) is False  # nothing to reset
    await store.append(SK, "run-1", [Message.user(str(i)) for i in range(4)])
    await store.replace_after_compaction(SK, "sum", [Message.user("3")], expected_len=4)
    await store.record_usage(SK, 100, 20)
    assert await store.reset(SK) is True
    assert await store.history(SK) == []
    assert await store.summary(SK) is None
    info = await store.show(SK)
    assert info.exists and info.resets == 1 and info.compactions == 0 and info.message_count == 0
    assert info.usage.total_prompt_tokens == 100 and info.usage.last_prompt_tokens == 0
    # The session goes on; run ids applied before the reset still apply once.
    assert await store.append(SK, "run-1", [Message.user("stale retry")]) is False
    assert await store.append(SK, "run-2", [Message.user("fresh")]) is True
    assert await store.history(SK) == [Message.user("fresh")]
    await store.reset(SK)
    assert (await store.show(SK)).resets == 2


async def test_usage_accounting(store: SessionStore) -> None:
    assert (await store.usage(SK)).total_prompt_tokens == 0
    await store.record_usage(SK, 1000, 50)
    await store.record_usage(SK, 1200, 70)
    usage = await store.usage(SK)
    assert (usage.last_prompt_tokens, usage.last_completion_tokens) == (1200, 70)
    assert (usage.total_prompt_tokens, usage.total_completion_tokens) == (2200, 120)
    assert await store.record_usage(SK, 5, 5, run_id="run-9") is True
    assert await store.record_usage(SK, 5, 5, run_id="run-9") is False
    assert (await store.usage(SK)).total_prompt_tokens == 2205
    assert (await store.show(SK)).version == 0, "usage does not change the history version"
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="prompt_tokens"):
            await store.record_usage(SK, bad, 0)  # type: ignore[arg-type]
    assert (await store.usage(SK)).total_prompt_tokens == 2205


async def test_show_and_list_sessions(store: SessionStore, redis_client: aioredis.Redis, keys: Keys) -> None:
    missing = await store.show("agent:main:nobody")
    assert not missing.exists and missing.message_count == 0 and missing.last_activity is None

    names = [f"agent:main:slack:channel:C{i}" for i in range(3)]
    for i, name in enumerate(names):
        await store.append(name, f"run-{i}", [Message.user("q"), Message.assistant("a")] * (i + 1))
    await store.record_usage(names[2], 10, 3)

    page = await store.list_sessions(limit=2)
    assert [s.session_key for s in page.sessions] == [names[2], names[1]]
    assert page.next_cursor == 2
    first = page.sessions[0]
    assert first.exists and first.message_count == 6 and first.usage.total_completion_tokens == 3
    assert first.created_at is not None and first.last_activity is not None
    rest = await store.list_sessions(cursor=page.next_cursor, limit=2)
    assert [s.session_key for s in rest.sessions] == [names[0]] and rest.next_cursor is None

    # Sessions idle past the TTL have expired: the index forgets them.
    await redis_client.zadd(keys.session_index(), {"agent:main:ancient": 1.0})
    listed = [s.session_key for s in (await store.list_sessions(limit=100)).sessions]
    assert "agent:main:ancient" not in listed and len(listed) == 3

    with pytest.raises(ValueError):
        await store.list_sessions(limit=0)
    with pytest.raises(ValueError):
        await store.list_sessions(cursor=-1)


async def test_unreadable_entries_are_skipped_not_lost(
    store: SessionStore, redis_client: aioredis.Redis, keys: Keys
) -> None:
    await store.append(SK, "run-1", [Message.user("a")])
    await redis_client.rpush(keys.session_messages(SK), '{"role": "wizard"}', "not json")
    await store.append(SK, "run-2", [Message.assistant("b")])
    assert await store.history(SK) == [Message.user("a"), Message.assistant("b")]
    snap = await store.snapshot(SK)
    assert snap.stored_count == 4 and len(snap.messages) == 2
    assert await redis_client.llen(keys.session_messages(SK)) == 4


def test_store_settings_are_validated(redis_client: aioredis.Redis, keys: Keys) -> None:
    with pytest.raises(ValueError):
        SessionStore(redis_client, keys, max_messages=0)
    with pytest.raises(ValueError):
        SessionStore(redis_client, keys, ttl_s=0)


async def test_run_usage_and_cost_are_recorded_once_per_run(store: SessionStore) -> None:
    assert await store.record_run_cost(SK, "run-1", 1000, 50, 0.0025) is True
    assert await store.record_run_cost(SK, "run-1", 1000, 50, 0.0025) is False  # a retry
    assert await store.record_run_cost(SK, "run-2", 300, 20, None) is True  # an unpriced model
    usage = await store.usage(SK)
    assert (usage.last_run_prompt_tokens, usage.last_run_completion_tokens) == (300, 20)
    assert usage.last_run_cost is None and usage.total_cost == pytest.approx(0.0025)
    await store.record_run_cost(SK, "run-3", 10, 1, 0.5)
    assert (await store.usage(SK)).total_cost == pytest.approx(0.5025)
    with pytest.raises(ValueError):
        await store.record_run_cost(SK, "run-4", -1, 0, None)


async def test_the_model_choice_survives_new_and_expires_with_the_session(
    store: SessionStore, redis_client: aioredis.Redis, keys: Keys
) -> None:
    assert await store.model(SK) is None
    await store.set_model(SK, "gpt-4o")
    assert await redis_client.ttl(keys.session_meta(SK)) > 0
    await store.append(SK, "run-1", [Message.user("hi")])
    await store.reset(SK)
    assert await store.model(SK) == "gpt-4o"


async def test_the_context_warning_is_given_once_until_the_context_drops(store: SessionStore) -> None:
    assert await store.note_context_warning(SK, True) is True
    assert await store.note_context_warning(SK, True) is False
    assert await store.note_context_warning(SK, False) is False
    assert await store.note_context_warning(SK, True) is True


async def test_a_context_warning_sent_again_after_a_lost_reply_is_still_given(
    store_client: aioredis.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SessionStore(store_client, keys)
    lost = LostReplies(monkeypatch, ":meta", 1, commands=("HSETNX", "EVAL", "EVALSHA"))
    assert await store.note_context_warning(SK, True) is True  # not taken for the second warning
    assert lost.lost == 1
    assert await store.note_context_warning(SK, True) is False


async def test_compaction_forgets_the_last_calls_usage(store: SessionStore) -> None:
    await store.append(SK, "run-1", [Message.user(str(i)) for i in range(6)])
    await store.record_usage(SK, 90_000, 500)
    assert await store.replace_after_compaction(SK, "sum", [Message.user("5")], expected_len=6)
    usage = await store.usage(SK)
    assert (usage.last_prompt_tokens, usage.last_completion_tokens) == (0, 0)
    assert usage.total_prompt_tokens == 90_000


async def test_a_run_is_read_in_one_step_and_recorded_in_one_step(store: SessionStore) -> None:
    await store.set_model(SK, "gpt-4o")
    assert await store.note_context_warning(SK, True) is True
    stored, compactions = await store.record_run(
        SK, "run-1", [Message.user("hi"), Message.assistant("hello")], [(100, 5), (120, 7)],
        price=lambda prompt, completion: prompt * 0.001 + completion * 0.01,
    )
    assert (stored, compactions) == (2, 0)
    loaded = await store.context(SK)
    assert [m.content for m in loaded.messages] == ["hi", "hello"] and loaded.summary is None
    assert loaded.model == "gpt-4o" and loaded.context_warned
    assert (loaded.usage.last_prompt_tokens, loaded.usage.last_run_prompt_tokens) == (120, 220)
    assert loaded.usage.total_cost == pytest.approx(0.22 + 0.12)
    # A retry of the same run changes nothing; a run below the line re-arms the warning.
    await store.record_run(SK, "run-1", [Message.user("hi")], [(100, 5)], rearm_warning=True)
    assert (await store.context(SK)).usage.total_cost == pytest.approx(0.34)
    assert not (await store.context(SK)).context_warned
    assert await store.note_context_warning(SK, True) is True


async def test_a_recorded_run_composes_with_the_single_writes_of_the_same_run(
    store: SessionStore, redis_client: aioredis.Redis, keys: Keys
) -> None:
    # A resumed run appended its messages already; its usage comes later, in one script.
    assert await store.append(SK, "run-1", [Message.user("hi"), Message.assistant("hello")])
    version = int(await redis_client.hget(keys.session_meta(SK), "version"))
    assert await store.record_usage(SK, 100, 5, run_id="run-1:0")  # the first call's, as record_run names it
    stored, _ = await store.record_run(
        SK, "run-1", [Message.user("hi"), Message.assistant("hello")], [(100, 5), (120, 7)],
    )
    assert stored == 2  # not appended twice
    assert int(await redis_client.hget(keys.session_meta(SK), "version")) == version  # history unchanged
    usage = await store.usage(SK)
    assert usage.total_prompt_tokens == 220 and usage.last_prompt_tokens == 120  # the first call once
    assert (usage.last_run_prompt_tokens, usage.last_run_completion_tokens) == (220, 12)
    ops = set(await redis_client.zrange(keys.session_ops(SK), 0, -1))
    assert {"a:run-1", "u:run-1:0", "u:run-1:1", "run:run-1"} <= ops


async def test_a_run_without_model_calls_records_only_its_messages(
    store: SessionStore, redis_client: aioredis.Redis, keys: Keys
) -> None:
    assert await store.record_run(SK, "run-1", [Message.user("blocked?")], []) == (1, 0)
    usage = await store.usage(SK)
    assert usage.total_prompt_tokens == 0 and usage.last_run_cost is None
    assert set(await redis_client.zrange(keys.session_ops(SK), 0, -1)) == {"a:run-1"}
    # Nothing at all to record: the history and its version stay as they were.
    version = await redis_client.hget(keys.session_meta(SK), "version")
    assert await store.record_run(SK, "run-2", [], []) == (1, 0)
    assert await redis_client.hget(keys.session_meta(SK), "version") == version


history_op = st.one_of(
    st.tuples(st.just("append"), st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=4)),
    st.tuples(st.just("compact"), st.integers(min_value=0, max_value=3)),
    st.tuples(st.just("reset"), st.just(0)),
    st.tuples(st.just("corrupt"), st.just(0)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(history_op, min_size=1, max_size=12))
async def test_a_history_read_again_is_what_the_store_holds(
    redis_client: aioredis.Redis, keys: Keys, ops: list[tuple[str, object]]
) -> None:
    """The reading replica keeps the decoded history between reads; another replica appends
    (trimmed at six messages), compacts, resets and writes entries that do not parse. Each
    read equals a read by a store that never read this session before."""
    reader = SessionStore(redis_client, keys, max_messages=6)
    writer = SessionStore(redis_client, keys, max_messages=6)
    key = f"agent:main:prop:{uuid.uuid4().hex}"
    for n, (op, arg) in enumerate(ops):
        if op == "append":
            assert isinstance(arg, list)
            await writer.append(key, f"run-{n}", [Message.user(text) for text in arg])
        elif op == "compact":
            assert isinstance(arg, int)
            snap = await writer.snapshot(key)
            keep = [Message.system(f"summary {n}"), *snap.messages[len(snap.messages) - arg :]]
            await writer.replace_after_compaction(key, f"summary {n}", keep, snap.stored_count)
        elif op == "reset":
            await writer.reset(key)
        else:
            await redis_client.rpush(keys.session_messages(key), "not json")
        fresh = SessionStore(redis_client, keys)
        assert await reader.history(key) == await fresh.history(key)
        assert (await reader.context(key)).messages == (await fresh.context(key)).messages
