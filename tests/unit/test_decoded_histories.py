"""DecodedHistories: a history read again parses only what it has not seen at that place."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import pydantic
import pytest
from structlog.testing import capture_logs

from agent.types import Message, ToolCall
from bot.store.sessions import DecodedHistories


def stored(*messages: Message) -> list[bytes]:
    return [m.model_dump_json(exclude_defaults=True).encode() for m in messages]


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes | str]]:
    """Every entry the store's JSON is parsed from, in order."""
    seen: list[bytes | str] = []
    real = Message.model_validate_json

    def counting(data: bytes | str, **kwargs: object) -> Message:
        seen.append(data)
        return real(data)

    monkeypatch.setattr(Message, "model_validate_json", counting)
    yield seen


A, B, C, D = (Message.user("a"), Message.assistant("b"), Message.user("c"), Message.assistant("d"))


def test_a_history_read_again_parses_only_what_was_appended(parses: list[bytes | str]) -> None:
    histories = DecodedHistories()
    first = histories.decode("s", stored(A, B))
    again = histories.decode("s", stored(A, B, C, D))
    assert again == [A, B, C, D]
    assert again[0] is first[0] and again[1] is first[1]
    assert parses == stored(A, B, C, D)  # each entry once


def test_each_read_is_a_list_of_its_own(parses: list[bytes | str]) -> None:
    histories = DecodedHistories()
    first = histories.decode("s", stored(A))
    first.append(B)
    assert histories.decode("s", stored(A)) == [A]


def test_entries_trimmed_off_the_front_leave_the_rest_reused(parses: list[bytes | str]) -> None:
    histories = DecodedHistories()
    histories.decode("s", stored(A, B, C))
    parses.clear()
    assert histories.decode("s", stored(B, C, D)) == [B, C, D]
    assert parses == stored(D)


def test_a_rewritten_history_is_read_as_it_is_now(parses: list[bytes | str]) -> None:
    """A compaction or a reset, and someone else's appends after it: only equal bytes are reused."""
    histories = DecodedHistories()
    histories.decode("s", stored(A, B, C))
    rewritten = [Message.system("summary"), C, Message.user("new")]
    assert histories.decode("s", stored(*rewritten)) == rewritten
    assert histories.decode("s", stored(D)) == [D]
    assert histories.decode("s", []) == []
    assert histories.decode("s", stored(A)) == [A]


def test_the_same_bytes_under_another_session_are_not_confused(parses: list[bytes | str]) -> None:
    histories = DecodedHistories()
    histories.decode("s", stored(A, B))
    assert histories.decode("t", stored(C, B)) == [C, B]
    assert histories.decode("s", stored(A, B)) == [A, B]


def test_text_and_bytes_replies_both_decode() -> None:
    histories = DecodedHistories()
    as_text = [entry.decode() for entry in stored(A, B)]
    assert histories.decode("s", as_text) == [A, B]
    assert histories.decode("s", [*as_text, *stored(C)]) == [A, B, C]


def test_unreadable_entries_are_skipped_and_logged_at_every_read() -> None:
    histories = DecodedHistories()
    raw = [*stored(A), b'{"role": "wizard"}', b"not json", *stored(B)]
    with capture_logs() as logs:
        assert histories.decode("s", raw) == [A, B]
        assert histories.decode("s", raw) == [A, B]
    unreadable = [(e["event"], e["position"]) for e in logs if e["log_level"] == "warning"]
    assert unreadable == [("store.session.unreadable_message", 1), ("store.session.unreadable_message", 2)] * 2


def test_memory_is_bounded_by_bytes_and_sessions() -> None:
    entry = 2 * len(stored(A)[0]) + 512  # as each entry is reckoned
    histories = DecodedHistories(max_memory=3 * entry, max_sessions=2)
    for session in ("s", "t", "u"):
        histories.decode(session, stored(A))
    assert list(histories._kept) == ["t", "u"]  # the least recently read went first
    histories.decode("t", stored(A))
    histories.decode("v", stored(A, A))  # "u" goes: the memory bound
    assert list(histories._kept) == ["t", "v"] and histories._memory == 3 * entry
    histories.decode("w", stored(A, A, A, A))  # larger than the whole bound: not kept
    histories.decode("v", stored(A, A, A, A))  # nor is a session's history that outgrew it
    assert list(histories._kept) == ["t"] and histories._memory == entry


def test_the_memory_reckoned_is_near_what_the_objects_take() -> None:
    """The bound stands for memory: 200 short histories of 50 entries kept, as counted by
    tracemalloc, within a quarter of what they are reckoned at."""
    raw = stored(*(Message.user(f"ss00001 message {i} please confirm mk00001x{i:03d}") for i in range(50)))
    histories = DecodedHistories()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for session in range(200):
            histories.decode(f"s{session}", [bytes(entry) for entry in raw])
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(histories._kept) == 200
    assert 0.75 < taken / histories._memory < 1.25


def test_a_stored_message_cannot_be_changed_in_place() -> None:
    """Reads share the decoded messages: a change must be a copy."""
    message = DecodedHistories().decode("s", stored(Message.assistant(None, [ToolCall(id="1", name="x")])))[0]
    with pytest.raises(pydantic.ValidationError):
        message.content = "changed"  # type: ignore[misc]
    assert message.tool_calls is not None
    with pytest.raises(pydantic.ValidationError):
        message.tool_calls[0].name = "y"  # type: ignore[misc]
    assert message.model_copy(update={"content": "copy"}).content == "copy"
