"""The one way botd opens Redis: a configured client, and the embedded server when needed.

``redis.url`` set: connect there (``redis://``, ``rediss://``, ``unix://``). Unset: join the
workspace's private Valkey server (:mod:`bot.store.embedded`), starting it if none runs.
Timeouts stay under redis-py's 5 s socket timeout and retries are explicit and bounded, so a
dead Redis shows up as :class:`StoreUnavailable` within seconds, not minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import hiredis
import redis.asyncio as aioredis
import structlog
from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bot.config import RedisConfig
from bot.store.embedded import EmbeddedValkey
from bot.store.errors import StoreConfigError, StoreUnavailable
from bot.store.keys import Keys

log = structlog.get_logger(__name__)

SCHEMES = ("redis", "rediss", "unix")
SOCKET_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 3.0
RETRIES = 3
BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 1.0
HEALTH_CHECK_INTERVAL_S = 30
OPEN_TIMEOUT_S = 10.0  # the first PING, retries included
# Connections one process opens (see BoundedConnectionPool); commands beyond wait their turn.
MAX_CONNECTIONS = 256
# A command waits this long for a free connection, then fails. Longer than the socket
# timeout: a burst that keeps the event loop busy also keeps connections busy for longer.
POOL_WAIT_S = 30.0
# Blocking commands (BLPOP, XREAD BLOCK …) must return before the socket timeout fires,
# or redis-py treats the wait as a dead connection and retries it.
MAX_BLOCKING_S = 4.0


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


class PromptWrite(AbstractConnection):
    """A connection whose writes cost what they must. Commands are packed by hiredis, as
    redis-py's own synchronous client does (its asyncio client packs in Python: 6.5 µs for
    an intake's EVALSHA against 1.1). Writes skip ``asyncio.wait_for`` when there is
    nothing to wait for: redis-py wraps every write in it, and on Python 3.11 that creates
    a task and costs an extra loop turn per command, about a third of a GET's CPU. A write
    the socket takes at once cannot time out: only one that leaves bytes buffered (a slow
    or stuck server) waits, under the socket timeout as before. A reply already whole in
    the parser's buffer is taken without arming a timeout (the pipeline's replies after its
    first arrive together). Mixed into the URL's connection class."""

    _packer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        # Same bytes as redis-py's packer; a value it cannot send is a DataError in both.
        # A one-word name and plain values go to hiredis as they are; redis-py's packer
        # (which splits "SCRIPT LOAD" and copies byte arrays) takes the rest.
        if type(args[0]) is str and args[0].isalpha():
            try:
                return [hiredis.pack_command(args)]
            except TypeError:
                pass
        return self._packer.pack(*args)

    async def read_response(
        self,
        disable_decoding: bool = False,
        timeout: float | None = None,
        *,
        disconnect_on_error: bool = True,
        push_request: bool | None = False,
    ) -> Any:
        # redis-py arms an asyncio timeout (a timer in the loop's heap) for every reply, and
        # a reply already whole in the hiredis reader's buffer cannot time out.
        parser = self._parser
        if (
            timeout is None and not disable_decoding and not push_request
            and type(parser) is _AsyncHiredisParser and parser._connected
        ):
            reader = parser._reader
            if reader is not None and reader.has_data():
                response = reader.gets()
                if response is not NOT_ENOUGH_DATA:
                    push = parser._hiredis_PushNotificationType
                    if push is None or not isinstance(response, push):
                        return await self._buffered_reply(response, disconnect_on_error)
                    await parser.handle_push_response(response)  # as the parser does, then read on
        return await super().read_response(
            disable_decoding, timeout, disconnect_on_error=disconnect_on_error, push_request=push_request
        )

    async def _buffered_reply(self, response: Any, disconnect_on_error: bool) -> Any:
        """What redis-py's parser and ``read_response`` do with a reply once it is parsed."""
        if isinstance(response, RedisConnectionError) or (
            isinstance(response, list) and response and isinstance(response[0], RedisConnectionError)
        ):
            if disconnect_on_error:
                await self.disconnect(nowait=True)
            raise response if isinstance(response, RedisConnectionError) else response[0]
        if self.health_check_interval:
            self.next_health_check = asyncio.get_running_loop().time() + self.health_check_interval
        if isinstance(response, ResponseError):
            raise response from None
        return response

    async def send_packed_command(self, command: bytes | str | Iterable[bytes], check_health: bool = True) -> None:
        writer = self._writer
        if writer is None or not self.is_connected:
            return await super().send_packed_command(command, check_health)
        if check_health:
            await self.check_health()
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes):
            command = [command]
        try:
            writer.writelines(command)
            if writer.transport.get_write_buffer_size():
                await asyncio.wait_for(writer.drain(), self.socket_timeout)
            else:
                await writer.drain()  # returns at once; raises if the connection is gone
        except TimeoutError:  # (an OSError too: first)
            await self.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            await self.disconnect(nowait=True)
            raise RedisConnectionError(f"Error while writing to socket: {exc}") from exc
        except BaseException:  # cancelled mid-write: the stream may hold half a command
            await self.disconnect(nowait=True)
            raise


@functools.cache
def prompt_write(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """``connection_class`` with :class:`PromptWrite`'s write (one class per kind)."""
    if issubclass(connection_class, PromptWrite):
        return connection_class
    return type(f"PromptWrite{connection_class.__name__}", (PromptWrite, connection_class), {})


class BoundedConnectionPool(aioredis.ConnectionPool):
    """redis-py's pool with a bound that queues. Its own pool fails a command at once when
    ``max_connections`` are busy, and without a bound a burst of a thousand chats opened a
    socket per concurrent command (~1,700). Here the command waits, up to ``wait_s``, for
    one to come back, first come first served (a newcomer never takes a connection a
    waiter was woken for); with a connection free it costs less than the plain pool: an idle
    connection is handed out and taken back without the pool's lock, events and metrics,
    which botd does not use, and without a task (redis-py's pipeline shields the release):
    about 10 µs of a GET's 70. New connections and ones to reconnect still go through
    redis-py's own steps."""

    def __init__(self, *, wait_s: float = POOL_WAIT_S, **kwargs: Any) -> None:
        kwargs["connection_class"] = prompt_write(kwargs.get("connection_class", aioredis.Connection))
        super().__init__(**kwargs)
        self._wait_s = wait_s
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._woken = 0  # waiters woken for a freed connection that have not taken it yet

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        deadline: float | None = None  # set on the first wait: a free connection costs no clock read
        while True:
            if self._waiters or self._woken or not self.can_get_connection():
                if deadline is None:
                    deadline = asyncio.get_running_loop().time() + self._wait_s
                await self._wait_turn(deadline)
            if self._available_connections and not self._lock.locked():
                connection = self._available_connections.pop()
                self._in_use_connections.add(connection)
                try:
                    await self.ensure_connection(connection)
                except BaseException:
                    await self.release(connection)
                    raise
                return connection
            try:
                return await super().get_connection()
            except MaxConnectionsError:  # taken while this one waited for the pool's lock
                continue

    def release(self, connection: Any) -> asyncio.Future[None]:  # type: ignore[override]
        """Give ``connection`` back; awaitable as redis-py's ``release``. Done at once unless
        the connection must reconnect first (a done future, so ``asyncio.shield`` around it
        starts no task)."""
        loop = asyncio.get_running_loop()
        if connection.should_reconnect() or self._lock.locked():
            return loop.create_task(self._release_then_wake(connection))
        self._in_use_connections.remove(connection)
        self._available_connections.append(connection)
        self._wake_one()
        done = loop.create_future()
        done.set_result(None)
        return done

    async def _release_then_wake(self, connection: Any) -> None:
        await super().release(connection)
        self._wake_one()

    async def _wait_turn(self, deadline: float) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        taken = False
        try:
            async with asyncio.timeout_at(deadline):
                await waiter
            taken = True
        except TimeoutError:
            raise RedisConnectionError(
                f"no Redis connection came free within {self._wait_s:g} s ({self.max_connections} in use)"
            ) from None
        finally:
            if waiter.done() and not waiter.cancelled():  # woken for a freed connection
                self._woken -= 1
                if not taken:
                    self._wake_one()  # ...but leaving without it (cancelled): it goes to the next
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._woken += 1
                return


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
        return aioredis.Redis.from_pool(BoundedConnectionPool.from_url(url, **options))
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
