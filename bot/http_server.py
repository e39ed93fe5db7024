"""The one HTTP server: health, readiness, metrics and the webhook routes channels add."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from bot import metrics
from channels.base import RouteHandler

log = structlog.get_logger(__name__)

# Returns {component: ok} for readiness.
ReadinessFn = Callable[[], Awaitable[dict[str, bool]]]


class ListenError(Exception):
    """The HTTP port cannot be bound (already in use, not permitted); phrased for the operator."""


class HttpServer:
    def __init__(
        self, host: str, port: int, max_body_bytes: int, readiness: ReadinessFn,
        details: Callable[[], dict[str, str]] = dict,
    ) -> None:
        self._details = details  # informational lines in /readyz (never make it fail)
        self._host = host
        self._port = port
        self._readiness = readiness
        self.app = web.Application(client_max_size=max_body_bytes, middlewares=[_body_limit(max_body_bytes)])
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/metrics", self._metrics)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    def add_route(self, method: str, path: str, handler: RouteHandler) -> None:
        self.app.router.add_route(method, path, handler)

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await self.stop()
            reason = exc.strerror or str(exc)
            raise ListenError(
                f"cannot listen on {self._host}:{self._port}: {reason} "
                "(is another botd running? set http.port to a free port)"
            ) from None
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self._port
        log.info("http.listening", host=self._host, port=self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, _: web.Request) -> web.Response:
        try:
            parts = await self._readiness()
        except Exception as exc:
            return web.json_response({"status": "down", "error": str(exc)}, status=503)
        down = sorted(name for name, ok in parts.items() if not ok)
        body = {"status": "ready" if not down else "down", "down": down, "checks": parts, **self._details()}
        return web.json_response(body, status=200 if not down else 503)

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), content_type="text/plain", charset="utf-8")


def _body_limit(limit: int) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Reject an oversized body from its Content-Length, before reading any of it.

    A body without one (chunked) or inflated by its Content-Encoding is bounded when a
    handler reads it (``request.read()`` against ``client_max_size``: 413). A body that
    cannot be decoded (a broken gzip stream, bad chunk framing) surfaces only then, as
    aiohttp's parser error, and is answered 400 here instead of a 500.
    """

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        length = request.content_length
        if length is not None and length > limit:
            return web.json_response({"error": f"body too large ({length} > {limit} bytes)"}, status=413)
        try:
            return await handler(request)
        except web.RequestPayloadError as exc:
            log.info("http.bad_body", path=request.path, error=str(exc)[:200])
            return web.json_response({"error": "the request body cannot be decoded"}, status=400)

    return middleware
