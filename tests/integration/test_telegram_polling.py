"""Polling intake against the fake Bot API: submit, offsets, leader lease, 409s, stalls, commands."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from structlog.testing import capture_logs

from agent.types import TelegramChat
from tests.fakes.store_requests import StoreRequests
from tests.fakes.telegram_context import TelegramHarness

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def h(redis_client: aioredis.Redis, redis_prefix: str) -> AsyncIterator[TelegramHarness]:
    async with TelegramHarness(redis_client, redis_prefix) as harness:
        yield harness


async def test_dm_is_submitted_as_run_request(h: TelegramHarness) -> None:
    await h.channel()
    msg = h.fake.private_message(42, "hello bot", username="ann", first_name="Ann")
    update_id = h.fake.push_message(msg)
    [req] = await h.recorder.wait_requests(1)
    assert req.session_key == "agent:main:telegram:dm:42"
    assert (req.channel, req.chat_id, req.user_id, req.user_name, req.text) == ("telegram", "42", "42", "Ann", "hello bot")
    assert req.dedupe_key == f"telegram:{update_id}"
    assert req.reply_to == str(msg["message_id"]) and req.thread_id is None
    assert req.chat == TelegramChat(chat_type="private", is_forum=False)


async def test_group_topic_session_and_thread(h: TelegramHarness) -> None:
    await h.channel()
    h.fake.push_message(h.fake.group_message(-1005, 42, "@botd_test_bot hi", forum=True, topic_id=77))
    h.fake.push_message(h.fake.group_message(-1005, 42, "@botd_test_bot general", forum=True))
    topic, general = await h.recorder.wait_requests(2)
    assert topic.session_key == "agent:main:telegram:group:-1005:topic:77" and topic.thread_id == "77"
    assert general.session_key == "agent:main:telegram:group:-1005" and general.thread_id is None
    assert isinstance(topic.chat, TelegramChat) and topic.chat.is_forum


async def test_deletes_webhook_before_polling(h: TelegramHarness) -> None:
    h.fake.webhook_url = "https://old.example/hook"
    await h.channel()
    await h.fake.wait_calls("getUpdates")
    methods = [c.method for c in h.fake.calls]
    assert methods.index("deleteWebhook") < methods.index("getUpdates")
    h.fake.push_message(h.fake.private_message(42, "after webhook"))
    await h.recorder.wait_requests(1)


async def test_unauthorized_sender_is_logged_and_not_submitted(h: TelegramHarness) -> None:
    await h.channel()
    with capture_logs() as logs:
        h.fake.push_message(h.fake.private_message(666, "let me in"))
        h.fake.push_message(h.fake.private_message(42, "I am allowed"))
        [req] = await h.recorder.wait_requests(1)
    assert req.user_id == "42"
    denied = [e for e in logs if e["event"] == "telegram.unauthorized"]
    assert denied and denied[0]["user_id"] == "666" and denied[0]["log_level"] == "info"
    assert len(h.recorder.requests) == 1


async def test_failed_submit_keeps_the_update(h: TelegramHarness) -> None:
    h.recorder.fail_with = ConnectionError("store down")
    await h.channel()
    update_id = h.fake.push_message(h.fake.private_message(42, "must not be lost"))
    await h.fake.wait_calls("getUpdates", 3)
    assert h.recorder.requests == []
    assert any(u["update_id"] == update_id for u in h.fake.pending_updates)
    h.recorder.fail_with = None
    [req] = await h.recorder.wait_requests(1)
    assert req.text == "must not be lost"


async def test_offset_survives_restart(h: TelegramHarness) -> None:
    first = await h.channel()
    h.fake.push_message(h.fake.private_message(42, "one"))
    await h.recorder.wait_requests(1)
    await first.stop()
    await h.channel(replica_id="replica-b")
    h.fake.push_message(h.fake.private_message(42, "two"))
    await h.recorder.wait_requests(2)
    await asyncio.sleep(0.3)
    assert [r.text for r in h.recorder.requests] == ["one", "two"]


async def test_the_offset_is_not_written_per_message_but_on_renewal_and_stop(
    h: TelegramHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    ch = await h.channel(tuning={"lease_ttl_s": 30.0, "lease_renew_s": 10.0})
    requests = StoreRequests(monkeypatch)
    for i in range(3):
        last = h.fake.push_message(h.fake.private_message(42, f"m{i}"))
        await h.recorder.wait_requests(i + 1)
    assert "SET" not in requests.commands(":offset:")  # Telegram confirms them with the next getUpdates
    requests.reset()
    await ch.stop()
    assert requests.commands(":offset:") == ["SET"]
    assert await h.recorder.kv.get(f"telegram:offset:{h.fake.bot_id}") == str(last + 1)


async def test_the_offset_is_saved_with_the_lease_renewal(h: TelegramHarness) -> None:
    await h.channel(tuning={"lease_ttl_s": 1.5, "lease_renew_s": 0.3})
    last = h.fake.push_message(h.fake.private_message(42, "one"))
    await h.recorder.wait_requests(1)
    key = f"telegram:offset:{h.fake.bot_id}"
    for _ in range(50):
        if await h.recorder.kv.get(key) == str(last + 1):
            break
        await asyncio.sleep(0.1)
    assert await h.recorder.kv.get(key) == str(last + 1)


async def test_a_leader_that_dies_without_saving_its_offset_is_not_served_its_updates_again(
    h: TelegramHarness,
) -> None:
    first = await h.channel(tuning={"lease_ttl_s": 1.5, "lease_renew_s": 0.5})
    h.fake.push_message(h.fake.private_message(42, "one"))
    await h.recorder.wait_requests(1)
    polls = len(h.fake.calls_to("getUpdates"))
    await h.fake.wait_calls("getUpdates", polls + 1)  # the next poll confirms "one" to Telegram
    assert first.poller is not None and first.poller._task is not None
    first.poller._task.cancel()  # dies: no lease released...
    await asyncio.gather(first.poller._task, return_exceptions=True)
    await h.recorder.kv.delete(f"telegram:offset:{h.fake.bot_id}")  # ...and no offset saved
    await h.channel(replica_id="replica-b", tuning={"lease_ttl_s": 1.5, "lease_renew_s": 0.5})
    h.fake.push_message(h.fake.private_message(42, "two"))
    await h.recorder.wait_requests(2, within_s=10)
    await asyncio.sleep(0.3)
    assert [r.text for r in h.recorder.requests] == ["one", "two"]


async def test_only_the_leader_polls_and_the_other_takes_over(h: TelegramHarness) -> None:
    a = await h.channel(replica_id="replica-a")
    b = await h.channel(replica_id="replica-b")
    await h.fake.wait_calls("getUpdates", 3)
    assert a.poller is not None and b.poller is not None
    leaders = [c for c in (a, b) if c.poller and c.poller.is_leader]
    assert len(leaders) == 1
    leader = leaders[0]
    follower = b if leader is a else a
    for i in range(3):
        h.fake.push_message(h.fake.private_message(42, f"m{i}"))
    await h.recorder.wait_requests(3)
    await asyncio.sleep(1.0)  # let the follower try (and fail) to take the lease a few times
    assert h.fake.terminated_polls == 0 and a.poller.conflicts == 0 and b.poller.conflicts == 0
    assert len(h.recorder.requests) == 3

    stopped_at = time.monotonic()
    await leader.stop()
    h.fake.push_message(h.fake.private_message(42, "after failover"))
    await h.recorder.wait_requests(4, within_s=10)
    assert follower.poller is not None and follower.poller.is_leader
    assert time.monotonic() - stopped_at < 3.0  # lease TTL of the harness
    assert h.recorder.requests[-1].text == "after failover"


async def test_conflict_is_retried(h: TelegramHarness) -> None:
    h.fake.conflict_next(times=3)
    with capture_logs() as logs:
        ch = await h.channel()
        h.fake.push_message(h.fake.private_message(42, "through the conflict"))
        await h.recorder.wait_requests(1, within_s=10)
    assert ch.poller is not None and ch.poller.conflicts == 3
    assert sum(e["event"] == "telegram.poll_conflict" for e in logs) == 3


async def test_stalled_poller_is_restarted(h: TelegramHarness) -> None:
    h.fake.hang_next("getUpdates", 30)
    ch = await h.channel(tuning={"stall_timeout_s": 1.0})
    await h.fake.wait_calls("getUpdates", 1)
    h.fake.push_message(h.fake.private_message(42, "after the stall"))
    [req] = await h.recorder.wait_requests(1, within_s=15)
    assert req.text == "after the stall"
    assert ch.poller is not None and ch.poller.restarts >= 1


async def test_commands_are_set_only_when_changed(h: TelegramHarness) -> None:
    first = await h.channel()
    await h.fake.wait_calls("setMyCommands")
    assert h.fake.commands == [{"command": "stop", "description": "Stop the current run"},
                               {"command": "new", "description": "Start over"}]
    await first.stop()
    await h.channel(replica_id="replica-b")
    await h.fake.wait_calls("getUpdates")
    assert len(h.fake.calls_to("setMyCommands")) == 1
    h.recorder.commands = (("stop", "Stop"), ("status", "Show status"))
    await h.channel(replica_id="replica-c")
    assert len(h.fake.calls_to("setMyCommands")) == 2
    assert [c["command"] for c in h.fake.commands] == ["stop", "status"]


async def test_approval_button_from_allowed_user(h: TelegramHarness) -> None:
    await h.channel()
    approval = h.fake.message(h.fake.chat(42, kind="private"), h.fake.bot_user, "Approval needed",
                              extra={"reply_markup": {"inline_keyboard": [[{"text": "ok", "callback_data": "ap:a1:y"}]]}})
    h.fake.messages[(42, approval["message_id"])].reply_markup = approval["reply_markup"]
    h.fake.push_update(h.fake.callback_update(h.fake.user(42, "Ann"), approval, "ap:a1:y"))
    [req] = await h.recorder.wait_requests(1)
    assert req.text == "/approve a1" and req.dedupe_key and req.dedupe_key.startswith("telegram:cb:")
    assert req.session_key == "agent:main:telegram:dm:42"
    await h.fake.wait_calls("editMessageReplyMarkup")
    assert h.fake.answered_callbacks[0]["text"] == "Approved."
    assert h.fake.messages[(42, approval["message_id"])].reply_markup is None


async def test_approval_button_from_stranger_is_rejected(h: TelegramHarness) -> None:
    await h.channel()
    approval = h.fake.message(h.fake.chat(-1001), h.fake.bot_user, "Approval needed")
    h.fake.push_update(h.fake.callback_update(h.fake.user(66, "Eve"), approval, "ap:a1:y"))
    await h.fake.wait_calls("answerCallbackQuery")
    assert h.fake.answered_callbacks[0]["text"] == "Not allowed."
    await asyncio.sleep(0.2)
    assert h.recorder.requests == []


async def test_is_ready_follows_lifecycle(h: TelegramHarness) -> None:
    ch = await h.channel(start=False)
    assert not ch.is_ready()
    await ch.start(h.recorder.context())
    assert ch.is_ready()
    await ch.stop()
    assert not ch.is_ready()


async def test_rejected_token_fails_start_without_leaking_it(h: TelegramHarness) -> None:
    from channels.telegram.adapter import TelegramChannel, TelegramStartError

    settings = h.make_settings(token="999:wrong-token-value")
    channel = TelegramChannel(settings)
    with pytest.raises(TelegramStartError) as err:
        await channel.start(h.recorder.context())
    assert "wrong-token-value" not in str(err.value)
    await channel.stop()


async def test_botd_run_with_a_rejected_token_prints_one_line_and_exits_2(
    h: TelegramHarness, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    config = tmp_path / "botd.yaml"
    config.write_text(
        f"agent: {{workspace: {tmp_path / 'ws'}}}\n"
        f"redis: {{url: '{redis_url}', prefix: {redis_prefix}}}\n"
        "llm: {api_key: test-key}\n"
        "http: {port: 0}\n"
        f"telegram: {{enabled: true, token: '999:wrong-token-value', api_base_url: '{h.fake.base_url}'}}\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.cli", "run", "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    _, raw_err = await asyncio.wait_for(proc.communicate(), timeout=120)
    err = raw_err.decode()
    assert proc.returncode == 2, err
    lines = [line for line in err.splitlines() if line.startswith("botd:")]
    assert lines == ["botd: the Bot API rejected telegram.token; check the token"]
    assert "Traceback" not in err
    assert "wrong-token-value" not in err


async def test_the_command_menu_carries_the_context_commands_once(h: TelegramHarness) -> None:
    from bot.gateway.control import COMMANDS

    h.recorder.commands = COMMANDS
    first = await h.channel()
    await h.fake.wait_calls("setMyCommands")
    names = [c["command"] for c in h.fake.commands]
    assert {"compact", "model", "usage", "stop", "status", "help"} <= set(names)
    await first.stop()
    await h.channel(replica_id="replica-b")  # a restart with the same list
    await h.fake.wait_calls("getUpdates")
    assert len(h.fake.calls_to("setMyCommands")) == 1
