"""Sessions do not see each other's files: per-user directories, the root read-only, under the sandbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.tools.sandbox import probe_bwrap
from agent.types import RunRequest
from bot.workspaces import directory_name, session_directory
from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.integration.gateway_harness import running_daemon

SECRET = "alice-private-diary-7731"


def tool_output(body: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content")) for m in body["messages"] if m["role"] == "tool")


@pytest.mark.skipif(probe_bwrap() is not None, reason="bubblewrap unusable here")
async def test_one_users_files_are_invisible_to_another(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with (
        FakeOpenAI() as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, agent={"workspace_scope": "user"}) as bot,
    ):
        root = bot.cfg.workspace
        (root / "IDENTITY.md").write_text("I am the bot.\n")
        fake.script(
            Reply.tool_calls([Call("bash", {"command": f"echo {SECRET} > diary.txt; pwd"})]),
            Reply.text("saved"),
        )
        await bot.send("keep my diary", chat_id="alice")
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        await bot.wait_idle("alice")
        alice_dir = root / "users" / "test-alice"
        assert (alice_dir / "diary.txt").read_text().strip() == SECRET
        fake.script(
            Reply.tool_calls([Call("bash", {"command": (
                "cat ../test-alice/diary.txt; cat $(find ../.. /tmp -name diary.txt 2>/dev/null); "
                f"grep -r {SECRET} ../.. /tmp 2>/dev/null; ls -la ..; cat ../../IDENTITY.md; "
                "echo hacked > ../../IDENTITY.md"
            )})]),
            Reply.tool_calls([Call("read_file", {"path": str(alice_dir / "diary.txt")})]),
            Reply.text("done"),
        )
        await bot.send("snoop", chat_id="bob")
        await bot.channel.wait_for(lambda ch: len(ch.texts("part")) >= 2)
        await bot.wait_idle("bob")
        seen = tool_output(fake.requests[-1])
        assert SECRET not in seen
        assert "I am the bot." in seen  # the agent's own files are readable
        assert (root / "IDENTITY.md").read_text() == "I am the bot.\n"  # and not writable


def test_ids_cannot_name_another_directory() -> None:
    assert directory_name("telegram", "../../etc") == "telegram-.2e.2e.2f.2e.2e.2fetc"
    assert directory_name("slack", "U1/..") != directory_name("slack", "U1")
    req = RunRequest(
        session_key="agent:main:slack:channel:C1", agent_id="main", channel="slack", chat_id="C1",
        user_id="U1", user_name="x", text="t",
    )
    assert session_directory(Path("/w"), req) == Path("/w/chats/slack-C1")
    dm = req.model_copy(update={"session_key": "agent:main:slack:dm:U1", "chat_id": "D9"})
    assert session_directory(Path("/w"), dm) == Path("/w/users/slack-U1")
