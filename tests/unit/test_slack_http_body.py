"""The HTTP Events body check: shape, lone surrogate escapes, and the parsed body it hands on."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest

from channels.slack.http_events import check_body

EVENT = {"type": "event_callback", "team_id": "T1", "event": {"type": "app_mention", "text": "hi"}}


def test_an_event_body_is_handed_on_parsed() -> None:
    problem, parsed = check_body(json.dumps(EVENT), "application/json")
    assert problem is None
    assert parsed == EVENT


@pytest.mark.parametrize("escape", ["\\ud83d", "\\uDE00", "\\udfff", "\\uD800 then text"])
def test_a_lone_surrogate_escape_is_refused(escape: str) -> None:
    raw = '{"type": "event_callback", "event": {"text": "' + escape + '"}}'
    assert check_body(raw, "application/json") == ("body holds a lone surrogate escape", None)
    form = urlencode({"payload": '{"type": "block_actions", "x": "' + escape + '"}'})
    assert check_body(form, "application/x-www-form-urlencoded") == ("payload holds a lone surrogate escape", None)


@pytest.mark.parametrize("text", ["\\ud83d\\ude00", "\\\\ud800 is written out", "\\u00e9", "plain"])
def test_surrogate_pairs_and_look_alikes_pass(text: str) -> None:
    raw = '{"type": "event_callback", "event": {"text": "' + text + '"}}'
    problem, parsed = check_body(raw, "application/json")
    assert problem is None
    assert parsed == json.loads(raw)


def test_forms_are_checked_but_not_handed_on() -> None:
    assert check_body(urlencode({"command": "/botd", "text": "stop"}), "application/x-www-form-urlencoded") == (
        None,
        None,
    )
    payload = urlencode({"payload": json.dumps({"type": "block_actions"})})
    assert check_body(payload, "application/x-www-form-urlencoded") == (None, None)
