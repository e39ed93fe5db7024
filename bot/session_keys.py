"""The one place session keys are built (DESIGN.md §4.3)."""

from __future__ import annotations

from typing import Literal

Scope = Literal["dm", "group", "channel"]


def session_key(
    agent_id: str,
    channel: str,
    scope: Scope,
    chat_id: str,
    *,
    thread: str | None = None,
    topic: str | None = None,
) -> str:
    """``agent:<id>:<channel>:<dm|group|channel>:<chat_id>[:thread:<id>|:topic:<id>]``.

    For DMs ``chat_id`` is the user's id, so each person has their own session.
    """
    if thread is not None and topic is not None:
        raise ValueError("a session is keyed by a thread or a topic, not both")
    key = f"agent:{agent_id}:{channel}:{scope}:{chat_id}"
    if thread is not None:
        key += f":thread:{thread}"
    elif topic is not None:
        key += f":topic:{topic}"
    return key


def cron_session_key(agent_id: str, job_id: str) -> str:
    return f"agent:{agent_id}:cron:{job_id}"


def heartbeat_session_key(agent_id: str) -> str:
    return f"agent:{agent_id}:heartbeat"
