"""How a run's end reaches the store, against the fake OpenAI server and a real Redis.

The run is recorded in the round trip that saves its result and claims its first part,
before anything is sent, so a crash after that step leaves history and ledger agreeing
(the retry neither asks the model again nor sends twice). The last part's "sent" mark
rides along the batch's finish in the inbox. Two store requests fewer per message."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.types import RunRequest
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.store_requests import StoreRequests
from tests.integration.gateway_harness import Bot, chat_request, dm_session, roles, running_daemon


@pytest.fixture
async def daemon(tmp_path: Path, redis_url: str, redis_prefix: str) -> AsyncIterator[tuple[FakeOpenAI, Bot]]:
    async with (
        FakeOpenAI() as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot,
    ):
        yield fake, bot


async def one_run(bot: Bot, text: str) -> RunRequest:
    """Submit ``text`` and wait until its run has ended."""
    req = chat_request(text)
    await bot.submit(req)
    await bot.wait_idle()
    return req


async def test_the_reply_is_recorded_with_its_first_claim(
    daemon: tuple[FakeOpenAI, Bot], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, bot = daemon
    fake.script(Reply.text("hello back"))
    requests = StoreRequests(monkeypatch)
    req = await one_run(bot, "hello")
    assert bot.channel.texts("part") == ["hello back"]
    history = bot.keys.session_messages(dm_session())
    claims = requests.commands(bot.keys.delivery(req.run_id))
    # The claim of part 0 (saving the result, then the claim's script) carries the append
    # and the usage records: one script records the append, the usage and the run's totals.
    assert claims[0] == "MULTI+SET+EVAL+EXPIRE+EVAL+EXEC"
    # The history is touched twice in all: the run's first read (with the message's intake,
    # which queued it and claimed it), and that claim.
    touched = requests.touching(history)
    assert len(touched) == 2 and touched[0] == requests.touching(bot.keys.inbox(dm_session()))[0]
    assert requests.commands(history)[1] == claims[0]
    assert roles(await bot.history()) == ["user", "assistant"]


async def test_a_silent_reply_is_recorded_with_its_saved_result(
    daemon: tuple[FakeOpenAI, Bot], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, bot = daemon
    fake.script(Reply.text("NO_REPLY"))
    requests = StoreRequests(monkeypatch)
    req = await one_run(bot, "nothing to say")
    saves = requests.commands(bot.keys.result(req.run_id))
    assert "EVAL" in saves[0].split("+") and "SET" in saves[0].split("+")
    assert bot.channel.texts("part") == []
    assert roles(await bot.history()) == ["user", "assistant"]


async def test_a_failed_send_still_leaves_the_run_recorded_once(daemon: tuple[FakeOpenAI, Bot]) -> None:
    fake, bot = daemon
    fake.script(Reply.text("this send fails"))
    bot.channel.fail_deliveries = 1
    req = await one_run(bot, "hello")
    history = await bot.history()
    assert roles(history) == ["user", "assistant"]
    assert history[-1].content == "this send fails"
    assert (await bot.app.ledger.states(req.run_id))["0"].startswith("failed:")
    assert len(fake.requests) == 1  # asked once


async def test_the_last_sent_mark_rides_along_the_finish(
    daemon: tuple[FakeOpenAI, Bot], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, bot = daemon
    fake.script(Reply.text("hello back"))
    requests = StoreRequests(monkeypatch)
    req = await one_run(bot, "hello")
    assert bot.channel.texts("part") == ["hello back"]
    ledger = requests.commands(bot.keys.delivery(req.run_id))
    assert len(ledger) == 2  # the claim, then the finish
    assert ledger[1] == "EVAL+HSET" and bot.keys.running(dm_session()).encode() in (
        requests.touching(bot.keys.delivery(req.run_id))[1]
    )
    assert (await bot.app.ledger.states(req.run_id))["0"].startswith("sent:")


async def test_every_part_but_the_last_is_marked_at_once(
    daemon: tuple[FakeOpenAI, Bot], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, bot = daemon
    monkeypatch.setattr(bot.channel, "format_parts", lambda text: text.split("|"))
    fake.script(Reply.text("one|two|three"))
    requests = StoreRequests(monkeypatch)
    req = await one_run(bot, "hello")
    assert bot.channel.texts("part") == ["one", "two", "three"]
    ledger = requests.commands(bot.keys.delivery(req.run_id))
    assert ledger.count("HSET") == 2 and ledger[-1] == "EVAL+HSET"
    states = await bot.app.ledger.states(req.run_id)
    assert [states[str(i)][:5] for i in range(3)] == ["sent:"] * 3
