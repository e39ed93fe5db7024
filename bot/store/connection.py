"""The one way botd opens Redis: a configured client, and the embedded server when needed.

``redis.url`` set: connect there (``redis://``, ``rediss://``, ``unix://``). Unset: join the
workspace's private Valkey server (:mod:`bot.store.embedded`), starting it if none runs.
Timeouts stay under redis-py's 5 s socket timeout and retries are explicit and bounded, so a
dead Redis shows up as :class:`StoreUnavailable` within seconds, not minutes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis.asyncio as aioredis
import structlog
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bot.config import RedisConfig
from bot.store.embedded import EmbeddedValkey
from bot.store.errors import StoreConfigError, StoreUnavailable
from bot.store.keys import Keys
from bot.store.pool import BoundedConnectionPool, LeanRedis

log = structlog.get_logger(__name__)

SCHEMES = ("redis", "rediss", "unix")
SOCKET_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 3.0
RETRIES = 3
BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 1.0
HEALTH_CHECK_INTERVAL_S = 30
OPEN_TIMEOUT_S = 10.0  # the first PING, retries included
# Sockets one process opens (see BoundedConnectionPool); commands beyond wait their turn.
# botd holds a connection for one round trip at a time (no blocking commands, no WATCH;
# the signal listener keeps one), so a few dozen carry far more than one event loop can
# issue; each costs ~16 KiB here and more in the server, for the process's life.
MAX_CONNECTIONS = 32


def redact_url(url: str) -> str:
    """The URL with its password (user-info or ``?password=``) replaced by ``***``."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            # A lone user-info part may be a password too (older URL habits): hide it.
            userinfo = userinfo.split(":", 1)[0] + ":***" if ":" in userinfo else "***"
            netloc = f"{userinfo}@{host}"
        query = parts.query
        if query:
            pairs = [(k, "***" if k.lower() == "password" else v) for k, v in parse_qsl(query, True)]
            query = urlencode(pairs, safe="*/")
        if netloc == parts.netloc and query == parts.query:
            return url
        shown = f"{parts.scheme}://{netloc}{parts.path}"
        shown += f"?{query}" if query else ""
        return shown + (f"#{parts.fragment}" if parts.fragment else "")
    except ValueError:
        return "<unparseable redis url>"


def create_client(url: str, **overrides: Any) -> aioredis.Redis:
    """The client factory: decode_responses, bounded timeouts, explicit retry with backoff,
    at most ``MAX_CONNECTIONS`` sockets (:class:`BoundedConnectionPool`)."""
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        raise StoreConfigError(
            f"redis.url must start with redis://, rediss:// or unix://, got {redact_url(url)!r}"
        )
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": SOCKET_TIMEOUT_S,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "retry": Retry(ExponentialBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S), RETRIES),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
        "max_connections": MAX_CONNECTIONS,
    }
    options.update(overrides)
    try:
        return LeanRedis.from_pool(BoundedConnectionPool.from_url(url, **options))
    except ValueError as exc:
        raise StoreConfigError(f"redis.url {redact_url(url)!r} is not valid: {exc}") from None


@dataclass
class RedisHandle:
    """An open store: the client, the key prefix, and (embedded mode) the server membership."""

    client: aioredis.Redis
    prefix: str
    url: str  # already redacted, safe to log
    embedded: bool
    keys: Keys
    _server: EmbeddedValkey | None = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)

    @property
    def started_server(self) -> bool:
        """True when this handle started the embedded server (it is stopped with the last user)."""
        return self._server is not None and self._server.started

    async def ping(self, timeout_s: float = 2.0) -> bool:
        """Readiness: does Redis answer within ``timeout_s``? Never raises."""
        try:
            async with asyncio.timeout(timeout_s):
                return bool(await self.client.ping())
        except (RedisError, OSError, TimeoutError):
            return False

    async def close(self) -> None:
        """Close the client; leave the embedded server (stopping it if no one else uses it)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.client.aclose()
        finally:
            if self._server is not None:
                await asyncio.to_thread(self._server.leave)

    async def __aenter__(self) -> RedisHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def open_redis(
    cfg: RedisConfig, workspace: Path, *, open_timeout_s: float = OPEN_TIMEOUT_S
) -> RedisHandle:
    """Connect as configured and check Redis answers; raises :class:`StoreUnavailable` if not."""
    keys = Keys(cfg.prefix)
    server: EmbeddedValkey | None = None
    if cfg.url:
        url = cfg.url
    else:
        server = EmbeddedValkey(workspace)
        await asyncio.to_thread(server.join)
        url = server.client_url
    shown = redact_url(url)
    try:
        client = create_client(url)
    except BaseException:
        if server is not None:
            await asyncio.to_thread(server.leave)
        raise
    handle = RedisHandle(
        client=client, prefix=cfg.prefix, url=shown, embedded=server is not None, keys=keys, _server=server
    )
    try:
        await _refuse_without_password(url, shown, open_timeout_s)
        async with asyncio.timeout(open_timeout_s):
            await client.ping()
    except StoreUnavailable:
        await handle.close()
        raise
    except TimeoutError:  # before OSError, of which it is a subclass
        await handle.close()
        raise StoreUnavailable(
            f"Redis at {shown} did not answer within {open_timeout_s:g} s", url=shown
        ) from None
    except (RedisError, OSError) as exc:
        await handle.close()
        raise StoreUnavailable(f"cannot use Redis at {shown}: {_describe(exc)}", url=shown) from None
    except BaseException:
        await handle.close()
        raise
    log.info("store.opened", url=shown, embedded=handle.embedded, started=handle.started_server)
    return handle


_AUTH_REPLIES = ("authentication required", "noauth", "wrongpass", "invalid username-password", "invalid password")


async def _refuse_without_password(url: str, shown: str, timeout_s: float) -> None:
    """One PING without retries: the client retries connection errors, and Redis answers a
    missing or wrong password with one, so a password problem would otherwise be retried
    until the open timeout and reported as a server that does not answer. A server that
    does not answer raises TimeoutError; other errors are left to the retried PING."""
    probe = create_client(url, retry=Retry(ExponentialBackoff(), 0), retry_on_error=[], max_connections=1)
    try:
        async with asyncio.timeout(timeout_s):
            await probe.ping()
    except TimeoutError:
        raise
    except (RedisError, OSError) as exc:
        if any(reply in str(exc).lower() for reply in _AUTH_REPLIES):
            raise StoreUnavailable(
                f"Redis at {shown} refused the password ({_describe(exc)}): put the server's password "
                "in redis.url (redis://:PASSWORD@host:6379/0) or REDIS_URL", url=shown,
            ) from None
    finally:
        await probe.aclose()


def _describe(exc: BaseException) -> str:
    """The error text without anything that could echo credentials back."""
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]
