"""Local fakes of the services botd talks to, speaking their real wire formats."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def serving_app(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 at a free port; yields its base URL (no trailing slash)."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
