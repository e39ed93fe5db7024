"""History pipeline: turn limit, pruning, pairing repair, token estimate, prepare_history."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.history import (
    CLEARED_RESULT,
    MISSING_RESULT,
    SUMMARY_ACK,
    SUMMARY_HEADER,
    context_usage,
    estimate_tokens,
    keep_last_turns,
    prepare_history,
    prune_tool_results,
    repair_pairing,
)
from agent.pruning import prunable_indices, soft_trim, trim_marker
from agent.tokens import estimate_text_tokens, estimate_tokens_exact, message_tokens
from agent.types import Message, ToolCall


def call(call_id: str, name: str = "read_file", arguments: str = "{}") -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def asks(*ids: str) -> Message:
    return Message.assistant(None, [call(i) for i in ids])


def roles(messages: list[Message]) -> list[str]:
    return [m.role for m in messages]


def assert_valid_pairing(messages: list[Message]) -> None:
    """What the chat API requires: results right after their call, each call answered once."""
    seen: set[str] = set()
    i = 0
    while i < len(messages):
        message = messages[i]
        assert message.role != "tool", f"stray tool result at {i}"
        i += 1
        if message.role == "assistant" and message.tool_calls:
            ids = [c.id for c in message.tool_calls]
            assert not seen & set(ids) and len(set(ids)) == len(ids), "reused call id"
            seen |= set(ids)
            answered = []
            while i < len(messages) and messages[i].role == "tool":
                answered.append(messages[i].tool_call_id)
                i += 1
            assert sorted(answered) == sorted(ids)


# --- keep_last_turns ----------------------------------------------------------------


def conversation(turns: int) -> list[Message]:
    messages = [Message.system("sys")]
    for n in range(turns):
        messages += [
            Message.user(f"u{n}"),
            asks(f"c{n}"),
            Message.tool(f"c{n}", f"r{n}"),
            Message.assistant(f"a{n}"),
        ]
    return messages


def test_keep_last_turns_keeps_whole_turns_and_leading_system() -> None:
    kept = keep_last_turns(conversation(5), 2)
    assert kept[0] == Message.system("sys")
    assert [m.content for m in kept if m.role == "user"] == ["u3", "u4"]
    assert roles(kept) == ["system"] + ["user", "assistant", "tool", "assistant"] * 2


def test_keep_last_turns_short_history_is_unchanged() -> None:
    history = conversation(2)
    assert keep_last_turns(history, 5) == history
    assert keep_last_turns([], 3) == []


def test_keep_last_turns_rejects_zero() -> None:
    with pytest.raises(ValueError, match="turns"):
        keep_last_turns(conversation(1), 0)


def test_keep_last_turns_drops_leading_orphans_before_the_cut() -> None:
    history = [Message.tool("x", "stray"), Message.assistant("hi"), Message.user("a"), Message.user("b")]
    assert keep_last_turns(history, 1) == [Message.user("b")]


# --- repair_pairing -----------------------------------------------------------------


def test_repair_renames_ids_reused_inside_one_message_and_pairs_in_order() -> None:
    history = [
        Message.user("q"),
        asks("a", "a", "a_dedup_1"),
        Message.tool("a", "r1"),
        Message.tool("a", "r2"),
    ]
    repaired = repair_pairing(history)
    assert [c.id for c in repaired[1].tool_calls or []] == ["a", "a_dedup_1", "a_dedup_1_dedup_1"]
    assert [(m.tool_call_id, m.content) for m in repaired[2:]] == [
        ("a", "r1"),
        ("a_dedup_1", "r2"),
        ("a_dedup_1_dedup_1", MISSING_RESULT),
    ]
    assert repaired[-1].is_error
    assert_valid_pairing(repaired)


def test_repair_picks_the_smallest_free_dedup_number() -> None:
    history = [
        asks("x"),
        Message.tool("x", "1"),
        asks("x_dedup_1"),
        Message.tool("x_dedup_1", "2"),
        asks("x"),
    ]
    repaired = repair_pairing(history)
    assert (repaired[-2].tool_calls or [])[0].id == "x_dedup_2"
    assert repaired[-1].tool_call_id == "x_dedup_2"


def test_repair_drops_extra_and_late_results_and_keeps_order() -> None:
    history = [
        Message.user("q"),
        asks("a", "b"),
        Message.tool("b", "rb"),
        Message.tool("a", "ra"),
        Message.tool("a", "again"),
        Message.assistant("text"),
        Message.tool("a", "late"),
    ]
    repaired = repair_pairing(history)
    assert [(m.role, m.content) for m in repaired] == [
        ("user", "q"),
        ("assistant", None),
        ("tool", "rb"),
        ("tool", "ra"),
        ("assistant", "text"),
    ]


def test_repair_does_not_modify_its_input() -> None:
    history = [asks("a"), Message.tool("a", "r"), asks("a")]
    snapshot = [m.model_copy(deep=True) for m in history]
    repair_pairing(history)
    assert history == snapshot


tool_ids = st.sampled_from(["a", "b", "a_dedup_1", ""])
messages_strategy = st.lists(
    st.one_of(
        st.builds(Message.user, st.sampled_from(["u", "v"])),
        st.builds(
            Message.assistant, st.sampled_from(["t", None]), st.lists(st.builds(call, tool_ids), max_size=3)
        ),
        st.builds(Message.tool, tool_ids, st.sampled_from(["r", ""])),
        st.builds(Message.system, st.just("s")),
    ),
    max_size=25,
)


@settings(max_examples=300)
@given(messages_strategy)
def test_repair_always_yields_a_valid_history_and_is_idempotent(history: list[Message]) -> None:
    repaired = repair_pairing(history)
    assert_valid_pairing(repaired)
    assert repair_pairing(repaired) == repaired
    non_tool = [m for m in history if m.role != "tool"]
    assert [m.role for m in repaired if m.role != "tool"] == [m.role for m in non_tool]


# --- pruning ------------------------------------------------------------------------


def long_session(result_chars: int, results: int = 4) -> list[Message]:
    messages = [Message.system("sys"), Message.user("first")]
    for n in range(results):
        messages += [asks(f"c{n}"), Message.tool(f"c{n}", f"<{n}>" + "z" * result_chars)]
    messages += [
        Message.assistant("one"),
        Message.user("u"),
        Message.assistant("two"),
        Message.assistant("three"),
    ]
    return messages


def test_soft_trim_keeps_head_tail_and_a_short_marker() -> None:
    content = "H" * 1500 + "#" * 7000 + "T" * 1500
    trimmed = soft_trim(content)
    assert trimmed.startswith("H" * 1500) and trimmed.endswith("T" * 1500)
    assert "#" not in trimmed and "7000" in trimmed
    assert len(trim_marker(10**12)) <= 200


def test_prunable_excludes_protected_messages() -> None:
    history = long_session(10)
    indices = prunable_indices(history)
    assert all(history[i].role == "tool" for i in indices)
    assert indices == [3, 5, 7, 9]
    assert prunable_indices(history[:-2]) == [3, 5]  # tool-call messages are assistant turns too
    assert (
        prunable_indices([Message.user("q"), asks("a"), Message.tool("a", "r"), Message.assistant("x")]) == []
    )


def test_empty_results_are_not_prunable() -> None:
    history = long_session(10)
    history[3] = Message.tool("c0", "")
    assert 3 not in prunable_indices(history)


def test_prune_soft_trims_between_30_and_50_percent() -> None:
    history = long_session(9000)
    window = int(estimate_tokens(history) / 0.4)
    pruned = prune_tool_results(history, window)
    for i in (3, 5, 7, 9):
        assert pruned[i].content is not None and len(pruned[i].content or "") < 3200
        assert (pruned[i].content or "").startswith(f"<{(i - 3) // 2}>")
    assert history[3].content is not None and len(history[3].content) > 9000  # input untouched


def test_prune_clears_oldest_first_until_under_half() -> None:
    history = long_session(3900, results=6)
    window = int(estimate_tokens(history) * 1.45)  # needs roughly 2-3 results cleared
    pruned = prune_tool_results(history, window)
    cleared = [i for i, m in enumerate(pruned) if m.content == CLEARED_RESULT]
    assert cleared and cleared == list(range(3, 3 + 2 * len(cleared), 2))
    assert estimate_tokens_exact(pruned) <= window / 2
    uncleared = [m for m in pruned if m.role == "tool" and m.content != CLEARED_RESULT]
    assert uncleared, "clearing must stop as soon as the estimate is under half the window"
    before_last = [*pruned[: cleared[-1]], history[cleared[-1]], *pruned[cleared[-1] + 1 :]]
    assert estimate_tokens_exact(before_last) > window / 2


def test_prune_never_touches_protected_messages_even_when_over() -> None:
    huge = "q" * 100_000
    history = [Message.system(huge), Message.user(huge), asks("a"), Message.tool("a", huge)]
    history += [Message.assistant("1"), Message.assistant("2")]  # asks("a") is the third-from-last
    pruned = prune_tool_results(history, 1000)
    same = len(pruned) == len(history) and all(a == b for a, b in zip(pruned, history, strict=True))
    assert same, "a protected message was changed"  # no == on the lists: the diff of 100 kB is slow


def test_prune_below_threshold_returns_an_equal_copy() -> None:
    history = long_session(100)
    pruned = prune_tool_results(history, 1_000_000)
    assert pruned == history and pruned is not history


def test_prune_rejects_bad_window() -> None:
    with pytest.raises(ValueError, match="context_window_tokens"):
        prune_tool_results([], 0)


# --- tokens -------------------------------------------------------------------------


def test_estimate_tokens_contract() -> None:
    messages = [Message.user("abcd" * 10), asks("x"), Message.tool("x", "")]
    assert estimate_tokens_exact(messages) == 10 + 16 * 3
    assert estimate_tokens(messages) == 58
    assert estimate_tokens([Message.user("abc")]) == 17  # 16.75 rounded up
    assert estimate_tokens([]) == 0
    with_args = [Message.assistant(None, [call("x", "bash", "a" * 40)])]
    assert message_tokens(with_args[0]) == 16
    assert estimate_tokens(with_args, include_tool_calls=True) == 16 + 11  # (4 + 40) / 4
    assert estimate_text_tokens("abcde") == 2


def test_context_usage() -> None:
    assert context_usage(32_000, 128_000) == 0.25
    assert context_usage(256_000, 128_000) == 2.0
    with pytest.raises(ValueError):
        context_usage(1, 0)
    with pytest.raises(ValueError):
        context_usage(-1, 10)


# --- prepare_history ----------------------------------------------------------------


def test_prepare_history_injects_summary_after_system_and_keeps_it() -> None:
    history = conversation(6)
    prepared = prepare_history(
        history, history_turns=2, context_window_tokens=128_000, summary="  We talked.  "
    )
    assert prepared[0].role == "system"
    assert prepared[1] == Message.user(f"{SUMMARY_HEADER}\nWe talked.")
    assert prepared[2] == Message.assistant(SUMMARY_ACK)
    assert [m.content for m in prepared if m.role == "user"][1:] == ["u4", "u5"]


def test_prepare_history_without_summary_and_blank_summary() -> None:
    history = conversation(2)
    assert prepare_history(history, history_turns=10, context_window_tokens=128_000, summary=None) == history
    assert prepare_history(history, history_turns=10, context_window_tokens=128_000, summary=" ") == history


def test_prepare_history_runs_prune_then_repair() -> None:
    history = [Message.user("start"), asks("a", "b"), Message.tool("a", "x" * 50_000)]
    history += [Message.assistant("1"), Message.user("more"), Message.assistant("2"), Message.assistant("3")]
    history.insert(0, Message.tool("gone", "orphan"))
    prepared = prepare_history(history, history_turns=50, context_window_tokens=20_000, summary="s")
    assert_valid_pairing(prepared)
    results = {m.tool_call_id: m.content for m in prepared if m.role == "tool"}
    assert results["b"] == MISSING_RESULT
    assert results["a"] in (CLEARED_RESULT,) or len(results["a"] or "") < 3200


def test_prepare_history_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        prepare_history([], history_turns=0, context_window_tokens=1000)
    with pytest.raises(ValueError):
        prepare_history([], history_turns=1, context_window_tokens=0)
