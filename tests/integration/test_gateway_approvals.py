"""Admin tools ask the chat first: approved, denied, timed out (fails closed), or stopped."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fakes.lost_replies import LostReplies
from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.integration.gateway_harness import (
    Bot,
    assert_valid_history,
    dm_session,
    roles,
    running_daemon,
)

TOOLS_YAML = """\
tools:
  - name: deploy
    description: Deploy a service (leaves a marker file in the workspace).
    category: admin
    cmd: touch
    args: ["deployed-{{service}}"]
    parameters:
      service: {type: string, pattern: "^[a-z]+$", maxLength: 20}
"""

DEPLOY = Call("deploy", {"service": "web"})


def _tools_file(tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "cli_tools.yaml"
    path.write_text(TOOLS_YAML)
    return {"cli_tools_file": str(path)}


@contextlib.asynccontextmanager
async def deploy_asked(
    tmp_path: Path, redis_url: str, redis_prefix: str, answer: str, **sections: dict[str, object]
) -> AsyncIterator[tuple[FakeOpenAI, Bot, str]]:
    """A daemon asked to deploy, waiting for the approval it requested; the model then says ``answer``."""
    async with (
        FakeOpenAI() as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, security=_tools_file(tmp_path), **sections) as bot,
    ):
        fake.script(Reply.tool_calls([DEPLOY]), Reply.text(answer))
        await bot.send("deploy web please")
        yield fake, bot, await _approval_id(bot)


async def _approval_id(bot: Bot) -> str:
    await bot.channel.wait_for(lambda ch: ch.approvals)
    [(approval_id, summary)] = bot.channel.approvals
    assert summary.startswith("deploy ") and '"service": "web"' in summary
    return approval_id


def _tool_result(body: dict[str, object]) -> dict[str, object]:
    messages = body["messages"]
    assert isinstance(messages, list)
    [result] = [m for m in messages if m["role"] == "tool"]
    assert isinstance(result, dict)
    return result


async def test_approved_admin_tool_runs(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with deploy_asked(tmp_path, redis_url, redis_prefix, "Deployed web.") as (fake, bot, approval_id):
        assert not (bot.cfg.workspace / "deployed-web").exists()  # nothing runs before the answer
        result = await bot.send(f"/approve {approval_id}")
        assert (result.status, result.detail) == ("command", "approve")
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        await bot.wait_idle()
        assert bot.channel.texts("notice") == ["Approved."]
        assert bot.channel.texts("part") == ["Deployed web."]
        assert (bot.cfg.workspace / "deployed-web").exists()
        assert _tool_result(fake.requests[1]).get("content") == "[exit code: 0]"
        await bot.send(f"/approve {approval_id}")
        assert bot.channel.texts("notice")[-1] == f"Approval request {approval_id} is already approved."


async def test_denied_admin_tool_does_not_run(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with deploy_asked(tmp_path, redis_url, redis_prefix, "Understood, not deploying.") as (fake, bot, approval_id):
        # Only the chat the request was posted in may answer it.
        await bot.send(f"/approve {approval_id}", chat_id="999")
        assert bot.channel.texts("notice") == [f"Approval request {approval_id} belongs to another chat."]
        await bot.send(f"/deny {approval_id}")
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        await bot.wait_idle()
        assert bot.channel.texts("notice")[-1] == "Denied."
        assert bot.channel.texts("part") == ["Understood, not deploying."]
        assert not (bot.cfg.workspace / "deployed-web").exists()
        assert "denied" in str(_tool_result(fake.requests[1])["content"])
        assert_valid_history(await bot.history())


async def test_unanswered_approval_fails_closed(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with deploy_asked(
        tmp_path, redis_url, redis_prefix, "Nobody approved, so I did not deploy.", gateway={"approval_timeout_s": 0.5}
    ) as (fake, bot, approval_id):
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        await bot.wait_idle()
        assert not (bot.cfg.workspace / "deployed-web").exists()
        assert "denied" in str(_tool_result(fake.requests[1])["content"])
        await bot.send(f"/approve {approval_id}")  # too late
        assert bot.channel.texts("notice") == [f"Approval request {approval_id} is already expired."]
        assert not (bot.cfg.workspace / "deployed-web").exists()


async def test_stop_cancels_a_pending_approval(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with deploy_asked(tmp_path, redis_url, redis_prefix, "should never be asked for") as (fake, bot, approval_id):
        await bot.send("/stop")
        await bot.wait_idle()
        stored = await bot.redis.get(bot.keys.approval(approval_id))
        assert stored is not None and json.loads(stored)["status"] == "cancelled"
        await bot.send(f"/approve {approval_id}")
        assert bot.channel.texts("notice") == [
            "Stopped.",
            f"Approval request {approval_id} is already cancelled.",
        ]
        assert not (bot.cfg.workspace / "deployed-web").exists()
        assert len(fake.requests) == 1
        history = await bot.sessions.history(dm_session())
        assert roles(history) == ["user", "assistant", "tool"]
        assert_valid_history(history)


async def test_an_answer_sent_again_after_a_lost_reply_is_still_the_answer(
    tmp_path: Path, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store records the approval and its reply is lost; redis-py sends it again.
    async with deploy_asked(tmp_path, redis_url, redis_prefix, "Deployed web.") as (_fake, bot, approval_id):
        lost = LostReplies(monkeypatch, f":approval:{approval_id}", 1, commands=("EVAL", "EVALSHA"))
        await bot.send(f"/approve {approval_id}")
        assert lost.lost == 1
        assert bot.channel.texts("notice") == ["Approved."]  # not "already approved": it was this one
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        assert (bot.cfg.workspace / "deployed-web").exists()
        await bot.send(f"/approve {approval_id}")  # a second answer is still told apart
        assert bot.channel.texts("notice")[-1] == f"Approval request {approval_id} is already approved."
