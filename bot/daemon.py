"""The daemon's lifecycle: start every part in order, serve, drain on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket

import structlog

from agent.llm_types import ChatModel
from bot import __version__, metrics
from bot.app import App, build_channels, build_model, check_config
from bot.config import BotdConfig
from bot.http_server import HttpServer
from bot.logs import redact_text
from bot.loop_lag import LoopLagMonitor
from bot.replicas import ReplicaBeacon
from bot.store.connection import RedisHandle, open_redis
from channels.base import ChannelAdapter

log = structlog.get_logger(__name__)

MAX_SKIPPED_SHOWN = 10  # per MCP server in the replica record: it is rewritten every few seconds
# Young-generation threshold of the cyclic collector once the daemon serves. Each message
# allocates a few thousand containers, so Python's default (700) ran a collection several
# times per message; almost all of them die by reference count anyway.
SERVING_GC_THRESHOLD = (20_000, 20, 20)


def settle_collector() -> None:
    """Once started, move everything alive into the collector's permanent generation
    (``gc.freeze``: modules, config, clients live as long as the process, and scanning them
    on every full collection was pure cost) and collect the young generation less often.
    For the process of ``botd run``/``botd chat`` only: a test process starting many
    daemons keeps the default collector."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVING_GC_THRESHOLD)


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
        self._beacon: ReplicaBeacon | None = None

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
        # The same checks as `botd doctor`, before anything starts.
        check_config(cfg, model=self._model_override is None, channels=self._channels_override is None)
        cfg.workspace.mkdir(parents=True, exist_ok=True)
        self.store = await open_redis(cfg.redis, cfg.workspace)
        channels = self._channels_override if self._channels_override is not None else build_channels(cfg)
        model = self._model_override or build_model(cfg)
        self.app = app = App(cfg, self.store, model, channels)
        self.http = HttpServer(
            cfg.http.host, cfg.http.port, cfg.http.max_body_bytes, self.readiness,
            details=lambda: {"sandbox": app.sandbox.describe()},
        )
        await app.broadcast.start()
        await app.gateway.start()
        await app.mcp.start()  # returns at once: servers connect in the background
        for name, channel in channels.items():
            await channel.start(app.channel_context(name, self.http.add_route))
            self._started_channels.append(channel)
        if self._with_http:
            await self.http.start()
        app.redelivery.start()
        if self._with_scheduler:
            await app.scheduler.start()
        self._lag.start()
        self._beacon = ReplicaBeacon(self.store.client, self.store.keys, app.replica, self._identity(), self._state,
                                     on_beat=lambda ok: metrics.REDIS_UP.set(1 if ok else 0))
        await self._beacon.start()
        log.info("botd.started", replica=app.replica, channels=sorted(channels), redis=self.store.url,
                 event_loop=type(asyncio.get_running_loop()).__module__.split(".")[0])

    async def readiness(self) -> dict[str, bool]:
        checks = {"redis": bool(self.store and await self.store.ping())}
        metrics.REDIS_UP.set(1 if checks["redis"] else 0)
        for channel in self._started_channels:
            checks[f"channel:{channel.name}"] = channel.is_ready()
        return checks

    def _identity(self) -> dict[str, object]:
        port = self.http.port if self.http is not None and self._with_http else None
        return {"host": socket.gethostname(), "pid": os.getpid(), "version": __version__, "http_port": port,
                "mode": "run" if self._with_http else "chat"}

    async def _state(self) -> dict[str, object]:
        """What this replica reports with each beat (bot.replicas)."""
        channels = {channel.name: channel.is_ready() for channel in self._started_channels}
        state: dict[str, object] = {"channels": channels, "active_runs": metrics.active_runs()}
        if self.app is not None:
            state["sandbox"] = self.app.tool_settings.sandbox.describe()
            # Errors can quote a server's URL or stderr: what reaches the store is redacted like a log.
            state["mcp"] = [
                {**server.as_dict(), "last_error": redact_text(server.last_error) if server.last_error else None,
                 "skipped_tools": list(server.skipped_tools[:MAX_SKIPPED_SHOWN])}
                for server in self.app.mcp.snapshot()
            ]
        return state

    def request_stop(self) -> None:
        self._stop.set()

    async def wait(self) -> None:
        await self._stop.wait()

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop intake, let runs finish for ``grace_s`` (default ``shutdown_grace_s``), cancel the rest, close."""
        log.info("botd.stopping")
        if self._beacon is not None:
            with contextlib.suppress(Exception):
                await self._beacon.stop()
        for channel in reversed(self._started_channels):
            with contextlib.suppress(Exception):
                await channel.stop()
        app = self.app
        if app is not None:
            if self._with_scheduler:
                with contextlib.suppress(Exception):
                    await app.scheduler.stop(grace_s=1.0)
            await app.gateway.shutdown(self.cfg.gateway.shutdown_grace_s if grace_s is None else grace_s)
            await app.redelivery.stop()
            await app.mcp.stop()
            with contextlib.suppress(Exception):
                await app.traces.aclose()  # the last runs' traces
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
            with contextlib.suppress(Exception):
                await app.model.aclose()
        if self.store is not None:
            await self.store.close()
        log.info("botd.stopped")

    async def run_until_signal(self) -> None:
        """``botd run``: start, serve until SIGTERM/SIGINT, drain and stop."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await self.start()
        settle_collector()
        try:
            await self.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await self.stop()
