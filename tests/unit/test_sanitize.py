"""The output sanitize pipeline and the silent-reply checks, beyond the shared cases."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import sanitize as sanitize_module
from agent.sanitize import WHITESPACE, heartbeat_reply, is_silent_chat, is_silent_cron, sanitize

FRAGMENTS = [
    "<think>",
    "</think>",
    "<THINK >",
    "</think >",
    "<thinking a='1'>",
    "</thinking>",
    "<thought>",
    "</thought>",
    "<antThinking>",
    "</antthinking>",
    "<redacted_thinking>",
    "</redacted_thinking>",
    "<final>",
    "</ final >",
    "<tool_call>",
    "</tool_call>",
    '<invoke name="x">',
    "</invoke>",
    '<parameter name="p">',
    "</parameter>",
    "invfunction_calls",
    "[Tool Call: read_file]",
    "[Tool Result for x]",
    "[Historical context: y]",
    "Arguments:",
    "{",
    "}",
    "[System Message]",
    "NO_REPLY",
    "no_reply",
    "HEARTBEAT_OK",
    "\n",
    "\n\n",
    " ",
    "\t",
    "\u2028",
    "\x1c",
    "<",
    ">",
    "/",
    "[",
    "_",
    "*",
    "a",
    "b",
    "Same.",
    "x" * 301,
]

texts = st.one_of(
    st.text(),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=40).map("".join),
)


def is_subsequence(small: str, big: str) -> bool:
    remaining = iter(big)
    return all(char in remaining for char in small)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(texts)
def test_sanitize_only_deletes_and_is_stable_once_free_of_markup(text: str) -> None:
    """The property that holds for every input (strict idempotence does not, see below)."""
    once = sanitize(text)
    assert is_subsequence(once, text)
    assert once == once.strip()
    if "<" not in once and "[" not in once:
        assert sanitize(once) == once


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(texts)
def test_repeating_sanitize_reaches_a_fixed_point(text: str) -> None:
    current = text
    for _ in range(len(text) + 2):
        following = sanitize(current)
        if following == current:
            break
        assert len(following) < len(current)
        current = following
    assert sanitize(current) == current


@pytest.mark.parametrize(
    ("text", "once", "twice"),
    [
        # Removing a thinking block uncovers a downgraded tool-call line (step 2 ran earlier).
        ("<think>x</think>[Tool Call: f]", "[Tool Call: f]", ""),
        # Removing <final> tags joins the halves of a thinking block (step 3 ran earlier).
        ("<thi<final>nk>x</think>y", "<think>x</think>y", "y"),
    ],
)
def test_sanitize_is_not_idempotent_when_a_removal_uncovers_markup(text: str, once: str, twice: str) -> None:
    assert sanitize(text) == once
    assert sanitize(once) == twice


@settings(max_examples=300)
@given(texts)
def test_no_exception_on_any_string(text: str) -> None:
    assert isinstance(sanitize(text), str)
    assert isinstance(is_silent_chat(text), bool)
    assert isinstance(is_silent_cron(text), bool)
    result = heartbeat_reply(text)
    assert result is None or isinstance(result, str)


def test_whitespace_constant_is_exactly_what_str_isspace_accepts() -> None:
    computed = "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())
    assert set(WHITESPACE) == set(computed)


# --- step details the shared cases do not pin down ---------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<tool_call>\n</tool_call>", ""),  # only whitespace left
        ('<tool_use id="1"/>done', "done"),
        ("<TOOL_CALL>x</TOOL_CALL>", "<TOOL_CALL>x</TOOL_CALL>"),  # names are case-sensitive
        ("<invoke>x</invoke>", "<invoke>x</invoke>"),  # no trigger: left alone
        ("<tool_call>a</tool_call> <invoker>b</invoker>", "a <invoker>b</invoker>"),  # exact names
        ("<minimax:tool_call>\nhi\n</minimax:tool_call>", "hi"),
        ("<tool_call x <invoke>", ""),  # attributes run to the first ">"
        ("<tool_call no end", "<tool_call no end"),
    ],
)
def test_garbled_tool_xml(text: str, expected: str) -> None:
    assert sanitize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a<think>never closed", "a<think>never closed"),
        ("<thinker>kept</thinker>", "<thinker>kept</thinker>"),
        ("<Think>x</THINK>y", "y"),
        ("<think>a<thought>b</think>c</thought>d", "c</thought>d"),  # leftmost block first
        ("<think>a</thinking>b", "<think>a</thinking>b"),
        ("<think\nmode='x'>a</think\n>b", "b"),
        ("x</think>y", "x</think>y"),  # a lone closing tag stays
        ("<think>1</think><think>2", "<think>2"),
    ],
)
def test_thinking_blocks(text: str, expected: str) -> None:
    assert sanitize(text) == expected


def test_steps_keep_surrounding_text() -> None:
    text = "Intro\n[Tool Call: x]\n  Arguments: {}\n\n{\n}\n[Tool Result y]\nOutro\n\nEnd\n\nEnd"
    assert sanitize(text) == "Intro\nOutro\n\nEnd"


def test_echoed_system_block_runs_to_the_blank_line_only() -> None:
    assert sanitize("A\n  [System Message] x\ny\n \nB\nC") == "A\nB\nC"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NO_REPLY_because", True),  # "_" is not a letter or digit
        ("~NO_REPLY~", True),
        ("## NO_REPLY", True),
        ("NO_REPLY1", False),
        ("\u00a0NO_REPLY", True),  # any Unicode whitespace is trimmed
        ("ÑO_REPLY", False),
        ("NO_REPLYé", True),  # only ASCII letters and digits glue
        ("_", False),
    ],
)
def test_silent_chat_edges(text: str, expected: bool) -> None:
    assert is_silent_chat(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("done_NO_REPLY_", True),
        ("1NO_REPLY", False),
        ("xno_replyx NO_REPLY", True),
        ("éNO_REPLYé", True),
        ("NO-REPLY", False),
    ],
)
def test_silent_cron_edges(text: str, expected: bool) -> None:
    assert is_silent_cron(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("**HEARTBEAT_OK**", None),
        ("HEARTBEAT_OK HEARTBEAT_OK", None),
        ("HEARTBEAT_OKAY", "HEARTBEAT_OKAY"),
        ("XHEARTBEAT_OK", "XHEARTBEAT_OK"),
        ("HEARTBEAT_OK.\n" + "b" * 301 + "\n(HEARTBEAT_OK)", "b" * 301),
        ("Alert:" + "c" * 400 + "...HEARTBEAT_OK", "Alert:" + "c" * 400),  # touching wrappers go too
        ("Alert:" + "c" * 400 + "... HEARTBEAT_OK", "Alert:" + "c" * 400 + "..."),
        ("", ""),
    ],
)
def test_heartbeat_edges(text: str, expected: str | None) -> None:
    assert heartbeat_reply(text) == expected


# --- linear time on hostile input ---------------------------------------------------

MEGABYTE = 1_000_000
HOSTILE_UNITS = [
    " ",
    "\n",
    "\n\n",
    "a\n\n",
    "<",
    "< ",
    "<think",
    "<think ",
    "<think>",
    "<think x",
    "</think ",
    "<final",
    "< / final ",
    "<tool_call ",
    "<tool_call",
    "[Tool Call:",
    "[Tool Call: x]\n{\n",
    "[System Message]\n",
    "NO_REPLYx",
    "HEARTBEAT_OK ",
    "_ ",
    "ignore ",
]
FUNCTIONS: dict[str, Callable[[str], object]] = {
    "sanitize": sanitize,
    "is_silent_chat": is_silent_chat,
    "is_silent_cron": is_silent_cron,
    "heartbeat_reply": heartbeat_reply,
}


@pytest.mark.parametrize("unit", HOSTILE_UNITS)
def test_megabyte_hostile_input_is_fast(unit: str) -> None:
    text = (unit * (MEGABYTE // len(unit) + 1))[:MEGABYTE]
    for name, fn in FUNCTIONS.items():
        started = time.perf_counter()
        fn(text)
        elapsed = time.perf_counter() - started
        assert elapsed < 2.0, f"{name} took {elapsed:.2f}s on 1 MB of {unit!r}"


def test_thinking_scan_reuses_closing_tag_search() -> None:
    """Many openings and one far closing tag: each region is searched once, not per opening."""
    text = "<think>" * 100_000 + "x" * 500_000 + "</think>tail"
    started = time.perf_counter()
    assert sanitize(text) == "tail"
    assert time.perf_counter() - started < 2.0
    assert sanitize_module._THINKING_CLOSE["think"].pattern.startswith("</")
