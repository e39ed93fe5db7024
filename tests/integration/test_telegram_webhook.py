"""Webhook intake on a real aiohttp server: secret check, bad bodies, submit, redelivery."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
import redis.asyncio as aioredis

from channels.telegram.adapter import TelegramChannel
from channels.telegram.webhook import SECRET_HEADER
from tests.fakes.telegram_context import TelegramHarness

pytestmark = pytest.mark.timeout(60)
SECRET = "s3cret_Value-123"


@pytest.fixture
async def h(redis_client: aioredis.Redis, redis_prefix: str) -> AsyncIterator[TelegramHarness]:
    async with TelegramHarness(redis_client, redis_prefix) as harness:
        yield harness


@pytest.fixture
async def ch(h: TelegramHarness) -> TelegramChannel:
    channel = await h.channel(mode="webhook", webhook_url=f"{h.http_base}/telegram", webhook_secret=SECRET)
    await h.serve_http()
    return channel


async def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as session, session.post(url, data=body, headers=headers) as resp:
        return resp.status, await resp.json()


def update_body(h: TelegramHarness, text: str = "hello") -> bytes:
    return json.dumps({"update_id": 777, "message": h.fake.private_message(42, text)}).encode()


async def test_start_registers_webhook_with_secret(h: TelegramHarness, ch: TelegramChannel) -> None:
    [call] = h.fake.calls_to("setWebhook")
    assert call.params["url"] == f"{h.http_base}/telegram"
    assert call.params["secret_token"] == SECRET
    assert call.params["allowed_updates"] == ["message", "callback_query"]
    assert h.fake.calls_to("getUpdates") == []
    assert ch.is_ready()


async def test_valid_update_is_submitted(h: TelegramHarness, ch: TelegramChannel) -> None:
    status = await h.fake.deliver_webhook({"message": h.fake.private_message(42, "via webhook")})
    assert status == 200
    [req] = h.recorder.requests
    assert req.text == "via webhook" and req.session_key == "agent:main:telegram:dm:42"


async def test_missing_secret_is_401(h: TelegramHarness, ch: TelegramChannel) -> None:
    status, _ = await post(f"{h.http_base}/telegram", update_body(h), {"Content-Type": "application/json"})
    assert status == 401 and h.recorder.requests == []


async def test_wrong_secret_is_403(h: TelegramHarness, ch: TelegramChannel) -> None:
    status = await h.fake.deliver_webhook({"message": h.fake.private_message(42, "x")}, secret="not-the-secret")
    assert status == 403 and h.recorder.requests == []


async def test_malformed_json_is_400(h: TelegramHarness, ch: TelegramChannel) -> None:
    headers = {SECRET_HEADER: SECRET, "Content-Type": "application/json"}
    status, body = await post(f"{h.http_base}/telegram", b"{not json", headers)
    assert status == 400 and "JSON" in str(body["description"])
    status, _ = await post(f"{h.http_base}/telegram", b'{"message": {}}', headers)
    assert status == 400
    status, _ = await post(f"{h.http_base}/telegram", b"[1, 2]", headers)
    assert status == 400
    status, _ = await post(f"{h.http_base}/telegram", b'{"update_id": 5, "message": {"text": "no chat"}}', headers)
    assert status == 400
    assert h.recorder.requests == []


async def test_redelivered_update_has_the_same_dedupe_key(h: TelegramHarness, ch: TelegramChannel) -> None:
    update = {"update_id": 4242, "message": h.fake.private_message(42, "once please")}
    assert await h.fake.deliver_webhook(update) == 200
    assert await h.fake.deliver_webhook(update) == 200
    first, second = h.recorder.requests
    assert first.dedupe_key == second.dedupe_key == "telegram:4242"
    assert len(h.recorder.unique) == 1


async def test_submit_failure_is_500_so_telegram_retries(h: TelegramHarness, ch: TelegramChannel) -> None:
    h.recorder.fail_with = ConnectionError("store down")
    assert await h.fake.deliver_webhook({"message": h.fake.private_message(42, "retry me")}) == 500


async def test_ignored_update_is_still_acknowledged(h: TelegramHarness, ch: TelegramChannel) -> None:
    assert await h.fake.deliver_webhook({"message": h.fake.private_message(666, "stranger")}) == 200
    assert await h.fake.deliver_webhook({"edited_message": h.fake.private_message(42, "edit")}) == 200
    assert h.recorder.requests == []


async def test_derived_secret_when_none_configured(h: TelegramHarness) -> None:
    channel = await h.channel(mode="webhook", webhook_url=f"{h.http_base}/tg", webhook_path="/tg")
    await h.serve_http()
    [call] = h.fake.calls_to("setWebhook")
    assert call.params["secret_token"] == channel.settings.effective_webhook_secret
    assert h.fake.token.split(":")[1] not in call.params["secret_token"]
    assert await h.fake.deliver_webhook({"message": h.fake.private_message(42, "derived")}) == 200
    assert h.recorder.requests[0].text == "derived"
