"""The chat user's vocabulary for model failures: what happened and what they can do,
never the operator's detail."""

from __future__ import annotations

import re
from typing import get_args

import pytest

from agent import notices
from agent.llm_types import LLMError, LLMErrorKind

# What belongs to the operator: config keys, HTTP, URLs, server bodies.
OPERATOR_WORDS = re.compile(r"llm\.|api_key|base_url|HTTP|\b\d{3}\b|https?://|finish_reason|check ", re.I)


def error(kind: LLMErrorKind, **kw: object) -> LLMError:
    return LLMError("operator detail: HTTP 418 from http://x/v1, check llm.api_key", kind=kind,
                    retryable=True, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", get_args(LLMErrorKind))
@pytest.mark.parametrize("started", [False, True])
def test_every_failure_reads_as_a_sentence_for_the_chat(kind: LLMErrorKind, started: bool) -> None:
    text = notices.failure_notice(error(kind, started=started))
    assert text.startswith(notices.FAILURE_PREFIX + ": ")
    assert not OPERATOR_WORDS.search(text), text
    assert "operator detail" not in text
    assert text.endswith(".") and ".)" not in text and ". ." not in text and ".." not in text
    assert len(text) < 200


def test_rate_limit_says_how_long_to_wait() -> None:
    assert "wait about 60 s" in notices.failure_notice(error("rate_limit", retry_after_s=60))
    assert "wait about 3 minutes" in notices.failure_notice(error("rate_limit", retry_after_s=150))
    assert "wait a minute" in notices.failure_notice(error("rate_limit"))
    assert "shortly" not in notices.failure_notice(error("rate_limit", retry_after_s=60))


def test_a_too_long_conversation_points_to_new_not_to_retrying() -> None:
    text = notices.failure_notice(error("bad_request", context_exceeded=True))
    assert "/new" in text and "try again" not in text.lower()


@pytest.mark.parametrize("kind", ["auth", "not_found", "bad_request"])
def test_configuration_problems_say_the_operator_was_told(kind: LLMErrorKind) -> None:
    assert notices.OPERATOR_TOLD in notices.failure_notice(error(kind))


def test_only_a_started_stream_is_called_cut_midway() -> None:
    assert "midway" in notices.failure_notice(error("stream", started=True))
    assert "midway" not in notices.failure_notice(error("stream", started=False))
    assert "midway" in notices.failure_notice(error("incomplete", started=True))


def test_cut_notices_are_one_line_each() -> None:
    assert set(notices.CUT_NOTICES) == {"length", "content_filter"}
    for text in (*notices.CUT_NOTICES.values(), notices.TIMEOUT, notices.INTERNAL_ERROR):
        assert "\n" not in text and not OPERATOR_WORDS.search(text)
    assert "continue" in notices.LENGTH
