"""The daemon's lifecycle: start every part in order, serve, drain on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import structlog

from agent.llm_types import ChatModel
from bot.app import App, build_channels, build_model
from bot.config import BotdConfig
from bot.http_server import HttpServer
from bot.loop_lag import LoopLagMonitor
from bot.store.connection import RedisHandle, open_redis
from channels.base import ChannelAdapter

log = structlog.get_logger(__name__)


class Daemon:
    """``botd run`` (all channels, scheduler, HTTP) or ``botd chat`` (console only)."""

    def __init__(
        self,
        cfg: BotdConfig,
        *,
        channels: dict[str, ChannelAdapter] | None = None,
        model: ChatModel | None = None,
        with_http: bool = True,
        with_scheduler: bool = True,
    ) -> None:
        self.cfg = cfg
        self._channels_override = channels
        self._model_override = model
        self._with_http = with_http
        self._with_scheduler = with_scheduler
        self.store: RedisHandle | None = None
        self.app: App | None = None
        self.http: HttpServer | None = None
        self._lag = LoopLagMonitor()
        self._stop = asyncio.Event()
        self._started_channels: list[ChannelAdapter] = []

    async def start(self) -> None:
        """Start every part in order; if one fails, stop what already started and re-raise."""
        try:
            await self._start()
        except BaseException:
            with contextlib.suppress(Exception):
                await self.stop()
            raise

    async def _start(self) -> None:
        cfg = self.cfg
        cfg.workspace.mkdir(parents=True, exist_ok=True)
        self.store = await open_redis(cfg.redis, cfg.workspace)
        channels = self._channels_override if self._channels_override is not None else build_channels(cfg)
        model = self._model_override or build_model(cfg)
        self.app = app = App(cfg, self.store, model, channels)
        self.http = HttpServer(cfg.http.host, cfg.http.port, cfg.http.max_body_bytes, self.readiness)
        await app.broadcast.start()
        await app.gateway.start()
        for name, channel in channels.items():
            await channel.start(app.channel_context(name, self.http.add_route))
            self._started_channels.append(channel)
        if self._with_http:
            await self.http.start()
        if self._with_scheduler:
            await app.scheduler.start()
        self._lag.start()
        log.info("botd.started", replica=app.replica, channels=sorted(channels), redis=self.store.url)

    async def readiness(self) -> dict[str, bool]:
        checks = {"redis": bool(self.store and await self.store.ping())}
        for channel in self._started_channels:
            checks[f"channel:{channel.name}"] = channel.is_ready()
        return checks

    def request_stop(self) -> None:
        self._stop.set()

    async def wait(self) -> None:
        await self._stop.wait()

    async def stop(self) -> None:
        """Stop intake, let runs finish for ``shutdown_grace_s``, cancel the rest, close."""
        log.info("botd.stopping")
        for channel in reversed(self._started_channels):
            with contextlib.suppress(Exception):
                await channel.stop()
        app = self.app
        if app is not None:
            if self._with_scheduler:
                with contextlib.suppress(Exception):
                    await app.scheduler.stop(grace_s=1.0)
            await app.gateway.shutdown(self.cfg.gateway.shutdown_grace_s)
        # Intake stopped first; replies of finishing runs needed the clients until now.
        for channel in self._started_channels:
            with contextlib.suppress(Exception):
                await channel.aclose()
        if self.http is not None:
            await self.http.stop()
        await self._lag.stop()
        if app is not None:
            await app.broadcast.close()
            with contextlib.suppress(Exception):
                await app.models.aclose()
            close = getattr(app.model, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
        if self.store is not None:
            await self.store.close()
        log.info("botd.stopped")

    async def run_until_signal(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await self.start()
        try:
            await self.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await self.stop()
