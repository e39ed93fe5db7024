"""The ``cron`` tool: schema validation through the registry, and each action's rules."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from agent.tools.registry import ToolContext, ToolError, ToolRegistry, ToolSettings
from agent.types import ToolPolicy
from bot.store.keys import Keys
from scheduler.cron_tool import CronTool
from scheduler.store import JobStore

NOW = datetime(2027, 6, 1, 10, 0, tzinfo=UTC)


def ctx(
    chat_id: str = "-100", channel: str = "telegram", thread: str | None = None, user: str = "u7"
) -> ToolContext:
    return ToolContext(
        run_id="r1",
        session_key=f"agent:main:{channel}:group:{chat_id}",
        settings=ToolSettings(workspace=Path("/tmp")),
        policy=ToolPolicy(),
        chat={"channel": channel, "chat_id": chat_id, "thread_id": thread},
        extra={"user_id": user},
    )


@pytest.fixture
def store(redis_client: aioredis.Redis, redis_prefix: str) -> JobStore:
    return JobStore(redis_client, Keys(redis_prefix))


@pytest.fixture
def tool(store: JobStore) -> CronTool:
    return CronTool(store, default_timezone="Europe/Berlin", clock=lambda: NOW, max_jobs_per_chat=3)


def test_schema_is_enforced_by_the_registry(tool: CronTool) -> None:
    registry = ToolRegistry([tool])
    assert registry.parse_arguments("cron", json.dumps({"action": "list"})) == {"action": "list"}
    for bad, where in [
        ({"action": "explode"}, "action"),
        ({}, "'action' is a required property"),
        ({"action": "remove", "id": "no spaces"}, "id"),
        ({"action": "add", "allow": ["admin"]}, "allow/0"),
        ({"action": "add", "when": "now"}, "Additional properties"),
        ({"action": "add", "prompt": ""}, "prompt"),
    ]:
        with pytest.raises(ToolError, match=where):
            registry.parse_arguments("cron", json.dumps(bad))
    assert tool.category == "write"


async def test_add_defaults_to_this_chat_and_thread(tool: CronTool, store: JobStore) -> None:
    out = await tool.execute(
        {"action": "add", "cron": "0 9 * * mon-fri", "prompt": "Summarize open PRs", "id": "prs"},
        ctx(chat_id="C5", channel="slack", thread="1717.1"),
    )
    assert not out.is_error
    assert "'prs'" in out.content and "cron 0 9 * * mon-fri (Europe/Berlin)" in out.content
    assert "2027-06-01 09:00:00 CEST" not in out.content  # 09:00 has passed at 12:00 Berlin
    assert "2027-06-02 09:00:00 CEST" in out.content
    job = await store.get("prs")
    assert job is not None
    assert (job.target.channel, job.target.chat_id, job.target.thread_id) == ("slack", "C5", "1717.1")
    assert job.created_in == job.target and job.created_by == "u7"
    assert job.allow == ()


async def test_add_relative_and_interval_and_write_grant(tool: CronTool, store: JobStore) -> None:
    out = await tool.execute({"action": "add", "in": "20m", "prompt": "Stretch!"}, ctx())
    assert "at 2027-06-01T12:20:00+02:00" in out.content  # shown in the default timezone
    await tool.execute(
        {"action": "add", "every": "2h", "prompt": "Check the queue", "allow": ["write"], "id": "q"}, ctx()
    )
    job = await store.get("q")
    assert job is not None and job.allow == ("write",)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"action": "add", "prompt": "x"}, "give exactly one schedule"),
        ({"action": "add", "prompt": "x", "in": "5m", "every": "1h"}, "got in, every"),
        ({"action": "add", "in": "5m"}, "prompt: required"),
        ({"action": "add", "prompt": "x", "cron": "0 25 * * *"}, "hour value 25"),
        ({"action": "add", "prompt": "x", "at": "2020-01-01T00:00:00Z"}, "in the past"),
        (
            {"action": "add", "prompt": "x", "in": "5m", "allow": ["admin"]},
            "only be granted from the command line",
        ),
        ({"action": "add", "prompt": "x", "in": "5m", "id": "heartbeat"}, "reserved"),
        ({"action": "remove"}, "remove needs the job 'id'"),
        ({"action": "remove", "id": "ghost"}, "no cron job with id 'ghost'"),
    ],
)
async def test_bad_requests_are_clear_errors(
    tool: CronTool, store: JobStore, args: dict[str, object], message: str
) -> None:
    with pytest.raises(ToolError, match=message):
        await tool.execute(args, ctx())
    assert await store.list() == []


async def test_needs_a_chat(tool: CronTool) -> None:
    no_chat = ctx()
    no_chat.chat = {}
    with pytest.raises(ToolError, match="no chat to schedule for"):
        await tool.execute({"action": "list"}, no_chat)
    with pytest.raises(ToolError, match="no chat to schedule for"):
        await tool.execute({"action": "add", "in": "5m", "prompt": "x"}, ctx(channel="cron"))


async def test_duplicate_id_is_an_error(tool: CronTool) -> None:
    await tool.execute({"action": "add", "every": "1h", "prompt": "x", "id": "same"}, ctx())
    with pytest.raises(ToolError, match="'same' already exists"):
        await tool.execute(
            {"action": "add", "every": "1h", "prompt": "y", "id": "same"}, ctx(chat_id="other")
        )


async def test_per_chat_limit(tool: CronTool) -> None:
    for n in range(3):
        await tool.execute({"action": "add", "every": "1h", "prompt": f"job {n}"}, ctx())
    with pytest.raises(ToolError, match="already has 3 cron jobs"):
        await tool.execute({"action": "add", "every": "1h", "prompt": "one more"}, ctx())
    await tool.execute({"action": "add", "every": "1h", "prompt": "another chat"}, ctx(chat_id="elsewhere"))


async def test_list_and_remove_are_per_chat(tool: CronTool, store: JobStore) -> None:
    await tool.execute({"action": "add", "every": "1h", "prompt": "mine", "id": "mine"}, ctx(chat_id="A"))
    await tool.execute({"action": "add", "every": "1h", "prompt": "theirs", "id": "theirs"}, ctx(chat_id="B"))
    listing = (await tool.execute({"action": "list"}, ctx(chat_id="A"))).content
    assert "mine" in listing and "theirs" not in listing
    assert (await tool.execute({"action": "list"}, ctx(chat_id="Z"))).content == "No cron jobs for this chat."
    with pytest.raises(ToolError, match="'theirs' was created in telegram chat B, not in this chat"):
        await tool.execute({"action": "remove", "id": "theirs"}, ctx(chat_id="A"))
    assert await store.get("theirs") is not None
    # Another thread of the same chat is the same chat.
    out = await tool.execute({"action": "remove", "id": "mine"}, ctx(chat_id="A", thread="9"))
    assert out.content == "Removed cron job 'mine'."
    assert await store.get("mine") is None
