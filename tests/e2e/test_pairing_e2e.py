"""DM pairing end to end: ``botd run`` with ``dm_policy: pairing`` against the fake Bot API
(and the fake Slack) and the fake LLM, and ``botd pairing …`` as the owner types it.

A stranger's DM gets a code and costs no LLM call; approving the code lets the user talk
(also after a restart, since approvals live in Redis); denying silences them; replies
are limited per user. Expiry is covered against the store with a moved clock
(tests/integration/test_pairing_store.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.pairing import APPROVED_TEXT, MAX_REPLIES_PER_HOUR
from tests.e2e.botd_process import REPO, BotdProcess, botd_run, clean_env, free_port, write_config
from tests.e2e.chat_rig import eventually
from tests.fakes.marker_router import Router, last_user_text
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import FakeSlack, message_event
from tests.fakes.telegram_server import FakeTelegram

pytestmark = [pytest.mark.e2e]

TOKEN = "123456:TEST-token-for-pairing"
OWNER = 7100  # listed in allow_from
CODE = re.compile(r"pairing code: ([A-Z0-9]{8})")


@dataclass
class Rig:
    tg: FakeTelegram
    llm: FakeOpenAI
    config: Path
    workdir: Path
    port: int

    def dm(self, user_id: int, text: str) -> None:
        self.tg.push_update({"message": self.tg.private_message(user_id, text, first_name=f"U{user_id}")})

    def texts(self, chat_id: int) -> list[str]:
        return [m.text for m in self.tg.sent_messages(chat_id)]

    def codes(self, chat_id: int) -> list[str]:
        return [m.group(1) for text in self.texts(chat_id) if (m := CODE.search(text))]

    def llm_saw(self, needle: str) -> bool:
        return any(needle in last_user_text(r) for r in self.llm.requests)

    async def wait_text(self, chat_id: int, predicate: Callable[[list[str]], bool], what: str) -> None:
        await eventually(lambda: predicate(self.texts(chat_id)), 15, f"{what}: {self.texts(chat_id)}")

    async def cli(self, *args: str) -> tuple[int, str, str]:
        return await pairing_cli(self.config, self.workdir, *args)

    @contextlib.asynccontextmanager
    async def botd(self) -> AsyncIterator[BotdProcess]:
        async with botd_run(self.config, self.port, self.workdir) as botd:
            await botd.wait_healthy()
            await eventually(lambda: bool(self.tg.calls_to("getUpdates")), 20, "polling")
            yield botd
            assert await botd.terminate() == 0, botd.log()[-3000:]


async def pairing_cli(config: Path, workdir: Path, *args: str) -> tuple[int, str, str]:
    """``botd pairing ARGS`` as the owner runs it: exit code, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "--config", str(config), "pairing", *args,
        cwd=str(workdir), env=clean_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def log_events(botd: BotdProcess, event: str) -> list[dict[str, Any]]:
    out = []
    for line in botd.log().splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("event") == event:
                out.append(record)
    return out


def pairing_config(workdir: Path, llm: FakeOpenAI, redis_url: str, port: int, **channel: dict[str, Any]) -> Path:
    """A config with one platform section (``telegram=`` or ``slack=``)."""
    return write_config(workdir / "botd.yaml", {
        "agent": {"workspace": str(workdir / "ws")},
        "llm": {"base_url": llm.base_url, "api_key": "test-key", "max_retries": 0},
        "redis": {"url": redis_url, "prefix": f"pair{uuid.uuid4().hex[:8]}"},
        "http": {"port": port},
        "queue": {"debounce_ms": 0},
        "gateway": {"shutdown_grace_s": 2},
        **channel,
    })


@pytest.fixture
async def rig(tmp_path: Path, redis_url: str) -> AsyncIterator[Rig]:
    async with FakeTelegram(TOKEN, bot_username="pairing_bot") as tg, FakeOpenAI(responder=Router()) as llm:
        port = free_port()
        config = pairing_config(tmp_path, llm, redis_url, port, telegram={
            "enabled": True, "token": TOKEN, "api_base_url": tg.base_url, "dm_policy": "pairing",
            "allow_from": [str(OWNER)],
        })
        yield Rig(tg, llm, config, tmp_path, port)
    assert not (REPO / "workspace").exists()


async def test_a_stranger_gets_a_code_and_once_approved_is_answered_across_restarts(rig: Rig) -> None:
    stranger = 7001
    async with rig.botd():
        rig.dm(stranger, "hello mkpair1")
        await rig.wait_text(stranger, lambda t: len(t) == 1 and "pairing code" in t[0], "a code")
        rig.dm(stranger, "/start")
        await rig.wait_text(stranger, lambda t: len(t) == 2, "the code again")
        first, again = rig.codes(stranger)
        assert first == again  # one live code per user
        assert not rig.llm.requests  # strangers cost no LLM call

        code, out, err = await rig.cli("list", "--json")
        assert code == 0, err
        pending = json.loads(out)["pending"]
        assert [(p["code"], p["channel"], p["user_id"]) for p in pending] == [(first, "telegram", str(stranger))]

        code, out, err = await rig.cli("approve", first.lower())
        assert code == 0, err
        assert "approved telegram user 7001" in out
        await rig.wait_text(stranger, lambda t: APPROVED_TEXT in t, "the approval notice")

        rig.dm(stranger, "now mkpair2")
        await rig.wait_text(stranger, lambda t: any("echo: now mkpair2" in x for x in t), "an answer")
        rig.dm(stranger, "/status")  # control commands count the user as allowed too
        await rig.wait_text(stranger, lambda t: any(x.startswith("Model:") for x in t), "/status")

        code, out, _ = await rig.cli("list")
        assert "No pending codes." in out and "7001" in out

    async with rig.botd():  # a restart keeps the approval
        rig.dm(stranger, "after restart mkpair3")
        await rig.wait_text(stranger, lambda t: any("echo: after restart mkpair3" in x for x in t), "an answer")

    code, _, err = await rig.cli("approve", first)  # used up
    assert code == 1 and "no live code" in err
    code, out, err = await rig.cli("revoke", "telegram", str(stranger))
    assert code == 0 and "revoked" in out, err
    code, _, err = await rig.cli("revoke", "telegram", str(stranger))
    assert code == 1 and "not approved" in err


async def test_denied_and_flooding_strangers_are_answered_a_few_times_then_not_at_all(rig: Rig) -> None:
    denied, flooder = 7002, 7003
    async with rig.botd() as botd:
        rig.dm(denied, "hi")
        await rig.wait_text(denied, lambda t: len(t) == 1, "a code")
        (code_text,) = rig.codes(denied)
        status, out, err = await rig.cli("deny", code_text)
        assert status == 0 and "denied telegram user 7002" in out, err
        rig.dm(denied, "hi again")

        for i in range(MAX_REPLIES_PER_HOUR + 2):
            rig.dm(flooder, f"spam {i}")

        def silent(user: int) -> int:
            return sum(1 for r in log_events(botd, "pairing.silent") if r.get("user_id") == str(user))

        await eventually(lambda: silent(denied) >= 1 and silent(flooder) >= 2, 15, "silenced strangers")
        assert len(rig.texts(denied)) == 1
        assert len(rig.texts(flooder)) == MAX_REPLIES_PER_HOUR
        assert len(set(rig.codes(flooder))) == 1
        assert not rig.llm.requests
        status, _, err = await rig.cli("approve", code_text)
        assert status == 1 and "no live code" in err
        status, _, err = await rig.cli("approve", "../../*")
        assert status == 1 and "no live code" in err


async def test_slack_stranger_is_paired_through_the_dm(tmp_path: Path, redis_url: str) -> None:
    stranger, dm = "UMALLORY", "DMALLORY"
    async with FakeSlack() as slack, FakeOpenAI(responder=Router()) as llm:
        port = free_port()
        config = pairing_config(tmp_path, llm, redis_url, port, slack={
            "enabled": True, "mode": "socket", "bot_token": slack.bot_token, "app_token": slack.app_token,
            "api_base_url": slack.api_url, "dm_policy": "pairing", "allow_from": ["UOWNER"],
        })

        def texts() -> list[str]:
            return [str(m.get("text") or "") for (ch, _), m in sorted(slack.messages.items()) if ch == dm]

        async def say(text: str, ts: str) -> None:
            event = message_event(text, channel=dm, user=stranger, ts=ts, channel_type="im")
            await slack.wait_ack(await slack.push_event(event, event_id=f"Ev{ts.replace('.', '')}"))

        async with botd_run(config, port, tmp_path) as botd:
            await botd.wait_healthy()
            await slack.wait_connected(within=15)
            await say("hello", "100.1")
            await eventually(lambda: any("pairing code" in t for t in texts()), 15, f"a code: {texts()}")
            assert not llm.requests
            found = CODE.search(texts()[0])
            assert found
            status, out, err = await pairing_cli(config, tmp_path, "approve", found.group(1))
            assert status == 0 and f"approved slack user {stranger}" in out, err
            await eventually(lambda: APPROVED_TEXT in texts(), 15, f"the approval notice: {texts()}")
            await say("now mkslackpair", "100.2")
            await eventually(lambda: any("echo: now mkslackpair" in t for t in texts()), 15, f"an answer: {texts()}")
            assert await botd.terminate() == 0, botd.log()[-3000:]
