"""A daemon with a real channel adapter against a platform fake, for the file tests.

``telegram_daemon`` starts :class:`bot.daemon.Daemon` with the real ``TelegramChannel``
polling the fake Bot API (tuned for short waits), the fake LLM and the test Redis;
``slack_daemon`` does the same with the real ``SlackChannel`` in Socket Mode; ``running``
is the daemon around any one channel (bench/attachments.py uses it too).
"""

from __future__ import annotations

import contextlib
import io
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from PIL import Image

from bot.config import BotdConfig
from bot.daemon import Daemon
from channels.base import ChannelAdapter
from channels.slack import SlackChannel, SlackSettings
from channels.telegram.adapter import TelegramChannel
from channels.telegram.settings import TelegramSettings
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.integration.gateway_harness import make_config

USER = 42


def jpeg_bytes(width: int, height: int, *, noise: bool = False) -> bytes:
    """A JPEG of the given size (``noise`` makes it large and hard to compress)."""
    img = Image.new("RGB", (width, height), (200, 30, 30))
    if noise:
        rnd = random.Random(7)
        img = Image.frombytes("RGB", (width, height), rnd.randbytes(width * height * 3))
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=95)
    return out.getvalue()


def read(path: str | Path) -> bytes:
    """A file's bytes (a plain function, so async tests need not call pathlib directly)."""
    return Path(path).read_bytes()


def inbox_files(workspace: Path) -> list[Path]:
    inbox = workspace / "inbox"
    return sorted(inbox.iterdir()) if inbox.exists() else []


@contextlib.asynccontextmanager
async def running(cfg: BotdConfig, name: str, channel: ChannelAdapter) -> AsyncIterator[Daemon]:
    """A daemon with ``channel`` as its only channel (no HTTP server, no scheduler)."""
    daemon = Daemon(cfg, channels={name: channel}, with_http=False, with_scheduler=False)
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop()


@contextlib.asynccontextmanager
async def telegram_daemon(
    tmp_path: Path, fake_llm: FakeOpenAI, redis_url: str, redis_prefix: str, **sections: dict[str, Any]
) -> AsyncIterator[tuple[FakeTelegram, Daemon]]:
    async with FakeTelegram() as tg:
        cfg = make_config(tmp_path, fake_llm, redis_url, redis_prefix, **sections)
        channel = TelegramChannel(TelegramSettings(
            token=tg.token, api_base_url=tg.base_url, allow_from=(str(USER),), groups=("*",),
            stream_edit_interval_s=0.3, lease_ttl_s=3.0, lease_renew_s=0.5, poll_timeout_s=1,
            poll_backoff_s=0.05, send_backoff_s=0.05, typing_interval_s=0.5,
        ))
        async with running(cfg, "telegram", channel) as daemon:
            yield tg, daemon


@contextlib.asynccontextmanager
async def slack_daemon(
    tmp_path: Path, fake_llm: FakeOpenAI, redis_url: str, redis_prefix: str, **sections: dict[str, Any]
) -> AsyncIterator[tuple[FakeSlack, Daemon]]:
    async with FakeSlack() as slack:
        cfg = make_config(tmp_path, fake_llm, redis_url, redis_prefix, **sections)
        channel = SlackChannel(SlackSettings(
            bot_token=slack.bot_token, app_token=slack.app_token, mode="socket", api_base_url=slack.api_url,
            allow_from=("U1",), channels=("C1",),
        ))
        async with running(cfg, "slack", channel) as daemon:
            await slack.wait_connected()
            yield slack, daemon
