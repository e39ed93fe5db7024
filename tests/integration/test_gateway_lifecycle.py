"""Daemon lifecycle: a start that fails half-way leaves nothing running behind it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.daemon import Daemon
from channels.base import ChannelContext
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.recording_channel import RecordingChannel
from tests.integration.gateway_harness import make_config

BACKGROUND = ("broadcast", "gateway-sweeper", "loop-lag")


class BrokenChannel(RecordingChannel):
    async def start(self, ctx: ChannelContext) -> None:
        raise RuntimeError("the platform rejected the token")


class TrackingChannel(RecordingChannel):
    stopped: bool = False

    async def stop(self) -> None:
        self.stopped = True


def _background_tasks() -> list[str]:
    return [t.get_name() for t in asyncio.all_tasks() if t.get_name() in BACKGROUND and not t.done()]


async def test_failed_start_cleans_up_what_it_started(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as fake:
        cfg = make_config(tmp_path, fake, redis_url, redis_prefix)
        good = TrackingChannel(name="first")
        daemon = Daemon(
            cfg,
            channels={"first": good, "second": BrokenChannel(name="second")},
            with_http=False,
            with_scheduler=False,
        )
        assert _background_tasks() == []
        with pytest.raises(RuntimeError, match="rejected the token"):
            await daemon.start()
        assert good.stopped  # the channel that did start was stopped again
        assert _background_tasks() == []
