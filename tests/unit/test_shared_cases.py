"""Runs every behaviour case in ``tests/cases`` (one test per JSON file).

The cases are data kept with the tests so a fresh clone needs nothing else. A
missing directory or an unknown case file is an error, never a skip.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.guard import scan
from agent.history import prune_tool_results, repair_pairing
from agent.sanitize import heartbeat_reply, is_silent_chat, is_silent_cron, sanitize
from agent.types import Message


def _cases_dir() -> Path:
    directory = Path(__file__).resolve().parents[1] / "cases"
    if not directory.is_dir() or not any(directory.glob("*.json")):
        raise RuntimeError(f"behaviour cases not found in {directory}")
    return directory


CASES_DIR = _cases_dir()
CASE_FILES = sorted(CASES_DIR.glob("*.json"))


def expand(value: Any) -> Any:
    """Replace every ``{"repeat", "times", "prefix"?, "suffix"?}`` object by its string."""
    if isinstance(value, dict):
        if "repeat" in value:
            return value.get("prefix", "") + value["repeat"] * value["times"] + value.get("suffix", "")
        return {key: expand(item) for key, item in value.items()}
    if isinstance(value, list):
        return [expand(item) for item in value]
    return value


def _wire(message: dict[str, Any]) -> dict[str, Any]:
    """The fields the cases compare (to_openai drops is_error and reasoning)."""
    return {
        "role": message["role"],
        "content": message.get("content"),
        "tool_calls": message.get("tool_calls") or None,
        "tool_call_id": message.get("tool_call_id"),
    }


def _check_string_fn(fn: Callable[[str], Any]) -> Callable[[dict[str, Any]], str | None]:
    def check(case: dict[str, Any]) -> str | None:
        got = fn(case["input"])
        if got != case["expected"]:
            return f"expected {case['expected']!r:.300}, got {got!r:.300}"
        return None

    return check


def _check_history_repair(case: dict[str, Any]) -> str | None:
    got = [_wire(m.to_openai()) for m in repair_pairing([Message.from_openai(m) for m in case["input"]])]
    want = [_wire(m) for m in case["expected"]]
    if got != want:
        return f"expected {json.dumps(want)[:600]}, got {json.dumps(got)[:600]}"
    return None


def _content_matches(got: str | None, want: Any) -> bool:
    if isinstance(want, dict):  # a soft-trimmed result
        return (
            got is not None
            and got.startswith(want["starts_with"])
            and got.endswith(want["ends_with"])
            and len(got) <= want["max_len"]
        )
    return got == want


def _check_pruning(case: dict[str, Any]) -> str | None:
    spec = case["input"]
    got = prune_tool_results(
        [Message.from_openai(m) for m in spec["messages"]], spec["context_window_tokens"]
    )
    want = case["expected"]
    if len(got) != len(want):
        return f"expected {len(want)} messages, got {len(got)}"
    for index, (message, expected) in enumerate(zip(got, want, strict=True)):
        wire = _wire(message.to_openai())
        if {k: v for k, v in wire.items() if k != "content"} != {
            k: v for k, v in _wire(expected).items() if k != "content"
        }:
            return f"message {index}: expected {_wire(expected)!r:.300}, got {wire!r:.300}"
        if not _content_matches(wire["content"], expected.get("content")):
            return f"message {index}: content {wire['content']!r:.120} does not match {expected.get('content')!r:.120}"
    return None


RUNNERS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "input_guard.json": _check_string_fn(scan),
    "sanitize.json": _check_string_fn(sanitize),
    "silent_chat.json": _check_string_fn(is_silent_chat),
    "silent_cron.json": _check_string_fn(is_silent_cron),
    "heartbeat_ok.json": _check_string_fn(heartbeat_reply),
    "history_repair.json": _check_history_repair,
    "pruning.json": _check_pruning,
}


def test_cases_directory_has_every_known_file() -> None:
    missing = sorted(set(RUNNERS) - {path.name for path in CASE_FILES})
    assert not missing, f"case files missing from {CASES_DIR}: {missing}"


@pytest.mark.parametrize("path", CASE_FILES, ids=[p.stem for p in CASE_FILES])
def test_case_file(path: Path) -> None:
    runner = RUNNERS.get(path.name)
    assert runner is not None, f"no runner for case file {path.name}: add one to RUNNERS"
    cases = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(cases, list) and cases, f"{path.name} holds no cases"
    failures = []
    for raw in cases:
        case = expand(raw)
        problem = runner(case)
        if problem:
            failures.append(f"{case['id']}: {problem}")
    assert not failures, f"{len(failures)} of {len(cases)} cases in {path.name} failed:\n" + "\n".join(
        failures
    )
