"""What a chat user is told when an answer fails, is cut, or is filtered.

One vocabulary, written for the person in the chat: what happened and what they can
do (wait, send ``/new``, try again), never operator advice such as config keys, URLs
or HTTP bodies; those stay in ``str(LLMError)`` for the log, the trace and ``botd
doctor``. The agent loop and the gateway both take their texts from here.
"""

from __future__ import annotations

import math

from agent.llm_types import LLMError

FAILURE_PREFIX = "Sorry — I couldn't get an answer from the model"
OPERATOR_TOLD = "The bot's operator has been told."

TIMEOUT = "Sorry — this took too long and was stopped. Please try again, perhaps with a smaller request."
INTERNAL_ERROR = f"Sorry — something went wrong on my side while answering. {OPERATOR_TOLD}"
# One line each, added under whatever text came.
LENGTH = "(The answer was cut off at the model's output limit. Ask me to continue if you want the rest.)"
CONTENT_FILTER = "(The model's provider filtered this answer, so it may be incomplete.)"

# The next request would not fit the model's context window even after compacting.
CONTEXT_FULL = (
    "Sorry — this request does not fit in the model's context window, even after summarizing the "
    "conversation. Send /compact to condense the conversation further, /new to start a fresh one, "
    "or send a shorter message."
)

# Finish reasons that end an answer early but still count as an answer, with their notice.
CUT_NOTICES = {"length": LENGTH, "content_filter": CONTENT_FILTER}

_AFTER = {
    "server": "the model service is having trouble. Please try again in a few minutes.",
    "connection": "the model service could not be reached. Please try again in a few minutes.",
    "timeout": "it did not finish in time. Please try again, perhaps with a shorter request.",
    "auth": f"the bot is not allowed to use it right now. {OPERATOR_TOLD}",
    "not_found": f"the bot's model settings look wrong. {OPERATOR_TOLD}",
    "bad_request": f"it refused the request. {OPERATOR_TOLD}",
    "empty": "it answered with nothing. Please try again, perhaps in other words.",
}


def failure_notice(error: LLMError) -> str:
    """The chat text for a model call that failed for good."""
    return f"{FAILURE_PREFIX}: {_what_happened(error)}"


def _what_happened(error: LLMError) -> str:
    if error.context_exceeded:
        return "this conversation has grown too long for it. Send /new to start a fresh one."
    if error.kind == "rate_limit":
        wait = error.retry_after_s
        if wait is not None and wait >= 1:
            return f"it is rate-limited right now. Please wait about {_seconds(wait)} and try again."
        return "it is rate-limited right now. Please wait a minute and try again."
    if error.kind in ("stream", "incomplete"):
        if error.started:
            return "the stream failed midway, so the answer was incomplete. Please send your message again."
        return "the model service is having trouble. Please try again in a few minutes."
    if error.kind == "protocol":
        return "it sent a malformed stream. Please try again in a few minutes."
    return _AFTER.get(error.kind, _AFTER["server"])


def context_warning(fill: float) -> str:
    """The one line added under a reply once the context passes the warning share."""
    return (
        f"(Context {math.floor(fill * 100)}% full: older messages will be summarized soon. "
        "/compact does it now, /new starts fresh.)"
    )


def _seconds(value: float) -> str:
    whole = math.ceil(value)
    if whole >= 120:
        return f"{math.ceil(whole / 60)} minutes"
    return f"{whole} s"
