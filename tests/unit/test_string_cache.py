"""Messages and run requests read from the store do not fill pydantic's process-wide
string cache with their values (new ones for every session, kept for the process's life)."""

from __future__ import annotations

from agent.types import Message, RunRequest


def test_a_run_request_read_twice_shares_none_of_its_values() -> None:
    raw = RunRequest(session_key="agent:main:test:dm:42", channel="test", chat_id="42", user_id="42",
                     text="hi").model_dump_json()
    first, second = RunRequest.model_validate_json(raw), RunRequest.model_validate_json(raw)
    assert first == second
    for field in ("run_id", "session_key", "chat_id", "user_id"):
        assert getattr(first, field) is not getattr(second, field), field  # not served from a cache


def test_a_message_read_twice_shares_none_of_its_values() -> None:
    raw = Message(role="tool", content="ok", tool_call_id="call_8f3a2b").model_dump_json()
    first, second = Message.model_validate_json(raw), Message.model_validate_json(raw)
    assert first == second
    assert first.tool_call_id is not second.tool_call_id
