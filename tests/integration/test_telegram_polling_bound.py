"""getUpdates stays bounded however the Bot API answers: at once, with errors, with
unreadable results or by dropping the connection; and updates still come through."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from structlog.testing import capture_logs

from tests.fakes.telegram_context import TelegramHarness

pytestmark = pytest.mark.timeout(60)

WINDOW_S = 3.0
# Within the window: a handful of polls, where an unbounded loop makes thousands.
MAX_POLLS = 12


@pytest.fixture
async def h(redis_client: aioredis.Redis, redis_prefix: str) -> AsyncIterator[TelegramHarness]:
    async with TelegramHarness(redis_client, redis_prefix) as harness:
        yield harness


async def polls_while_idle(h: TelegramHarness) -> int:
    await h.fake.wait_calls("getUpdates", 1)
    before = len(h.fake.calls_to("getUpdates"))
    await asyncio.sleep(WINDOW_S)
    return len(h.fake.calls_to("getUpdates")) - before


async def test_an_api_that_ignores_the_poll_timeout_is_not_hammered(h: TelegramHarness) -> None:
    h.fake.ignore_poll_timeout = True
    with capture_logs() as logs:
        ch = await h.channel()
        polls = await polls_while_idle(h)
    assert polls <= MAX_POLLS, polls
    assert sum(e["event"] == "telegram.poll_answered_early" for e in logs) == 1
    h.fake.push_message(h.fake.private_message(42, "still heard"))
    [req] = await h.recorder.wait_requests(1, within_s=10)
    assert req.text == "still heard"
    assert ch.poller is not None and ch.poller.healthy


@pytest.mark.parametrize("fault", ["500", "malformed", "drop", "502"])
async def test_a_failing_get_updates_backs_off_logs_once_and_recovers(h: TelegramHarness, fault: str) -> None:
    h.fake.chaos("getUpdates", 1.0, kinds=(fault,))
    with capture_logs() as logs:
        ch = await h.channel()
        polls = await polls_while_idle(h)
        assert polls <= MAX_POLLS, polls
        h.fake.calm("getUpdates")
        h.fake.push_message(h.fake.private_message(42, "after the outage"))
        [req] = await h.recorder.wait_requests(1, within_s=15)
    assert req.text == "after the outage"
    warnings = [e for e in logs if e["event"].startswith("telegram.poll_") and e["log_level"] == "warning"]
    assert len(warnings) == 1, warnings
    assert any(e["event"] == "telegram.poll_recovered" for e in logs)
    assert ch.poller is not None and ch.poller.healthy
