"""The client, connection class and pool behind every botd client
(:func:`bot.store.create_client`): what redis-py's asyncio client pays per command beyond
the socket, cut, and a bound on sockets that queues instead of failing.

:class:`PromptWrite` is mixed into the URL's connection class: hiredis packing, a write
without a timer when the socket takes it at once, a buffered reply without a timer.
:class:`BoundedConnectionPool` queues commands for a free connection, first come first
served, and hands idle connections out and back without redis-py's lock or a task.
:class:`LeanRedis` and its :class:`LeanPipeline` send a command or a pipeline and read
its replies straight off the connection, with redis-py's retries and reply callbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import hiredis
import redis.asyncio as aioredis
from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
from redis.asyncio.client import CommandStackT, Pipeline
from redis.asyncio.connection import AbstractConnection
from redis.client import EMPTY_RESPONSE, NEVER_DECODE
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ExecAbortError, MaxConnectionsError, ResponseError, WatchError
from redis.exceptions import TimeoutError as RedisTimeoutError

# A command waits this long for a free connection, then fails. Longer than the socket
# timeout: a burst that keeps the event loop busy also keeps connections busy for longer.
POOL_WAIT_S = 30.0


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
        error = response[0] if isinstance(response, list) and response else response
        if isinstance(error, RedisConnectionError):  # the reply, or a transaction's first
            if disconnect_on_error:
                await self.disconnect(nowait=True)
            raise error
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
                connection = self.get_available_connection()  # an idle one: no new socket
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


def _plain(name: Any, options: Mapping[str, Any]) -> bool:
    """Whether a command is one the lean path sends as redis-py would: not HIMPORT (whose
    wire form depends on the connection), without the options that change how its reply
    is read."""
    return (
        type(name) is str and not name.upper().startswith("HIMPORT")
        and NEVER_DECODE not in options and EMPTY_RESPONSE not in options
    )


async def _with_callback(callbacks: Any, name: Any, reply: Any, options: Mapping[str, Any]) -> Any:
    """``reply`` through the command's response callback, as ``Redis.parse_response`` does."""
    callback = callbacks.get(name)
    if callback is None:
        return reply
    cast(dict[str, Any], options).pop("keys", None)  # for client-side caching, which botd does not use
    reply = callback(reply, **options)
    return await reply if inspect.isawaitable(reply) else reply


class LeanRedis(aioredis.Redis):
    """redis-py's client with a shorter way to a reply. Its own path runs every command
    through two parsing layers, an HIMPORT check, and duration and error recorders that
    do nothing unless OpenTelemetry is set up; this one packs, writes and reads on the
    connection, applies the same reply callback, and retries as redis-py does, with the
    same failure handling (the connection is closed, the command sent again). A command
    this path does not cover, a pinned connection or a single-connection client goes
    redis-py's way."""

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        return LeanPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        name = args[0]
        if self.single_connection_client or self.connection is not None or not _plain(name, options):
            return await super().execute_command(*args, **options)
        pool = self.connection_pool
        conn = await pool.get_connection()
        start = time.monotonic()
        try:
            return await conn.retry.call_with_retry(
                lambda: self._send_and_read(conn, name, args, options),
                lambda error, failures: self._close_connection(conn, error, failures, start, name),
                with_failure_count=True,
            )
        finally:
            await pool.release(conn)

    async def _send_and_read(self, conn: Any, name: str, args: Sequence[Any], options: dict[str, Any]) -> Any:
        await conn.send_packed_command(conn.pack_command(*args))
        return await _with_callback(self.response_callbacks, name, await conn.read_response(), options)


class LeanPipeline(Pipeline):
    """redis-py's pipeline, written in one piece and its replies read straight off the
    connection: redis-py's own execute packs through a buffering packer, prepares HIMPORT
    field sets, and reads each reply through two parsing layers. Replies, errors and their
    annotations, callbacks, retries and the transaction's checks are redis-py's. WATCH,
    scripts registered on the pipeline (``Script`` objects: botd queues EVAL instead) and
    commands :func:`_plain` does not cover go redis-py's way."""

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = self.command_stack
        if (
            not stack or self.watching or self.scripts or self.explicit_transaction
            or self.connection is not None or not all(_plain(args[0], options) for args, options in stack)
        ):
            return await super().execute(raise_on_error)
        conn = self.connection = await self.connection_pool.get_connection()
        send = self._transaction if self.is_transaction else self._pipeline
        operation = "MULTI" if self.is_transaction else "PIPELINE"
        start = time.monotonic()
        try:
            replies: list[Any] = await conn.retry.call_with_retry(
                lambda: send(conn, stack, raise_on_error),
                lambda error, failures: self._disconnect_raise_on_watching(conn, error, failures, start, operation),
                with_failure_count=True,
            )
            return replies
        finally:
            await self.reset()

    @staticmethod
    async def _write(conn: Any, commands: Iterable[Sequence[Any]]) -> None:
        await conn.send_packed_command([part for args in commands for part in conn.pack_command(*args)])

    async def _pipeline(self, conn: Any, commands: CommandStackT, raise_on_error: bool) -> list[Any]:
        await self._write(conn, (args for args, _ in commands))
        replies: list[Any] = []
        for args, options in commands:
            try:
                replies.append(await _with_callback(self.response_callbacks, args[0], await conn.read_response(), options))
            except ResponseError as error:
                replies.append(error)
        if raise_on_error:
            self.raise_first_error(commands, replies)
        return replies

    async def _transaction(self, conn: Any, commands: CommandStackT, raise_on_error: bool) -> list[Any]:
        await self._write(conn, [("MULTI",), *(args for args, _ in commands), ("EXEC",)])
        errors: list[tuple[int, Exception]] = []
        try:
            await conn.read_response()
        except ResponseError as refused:
            errors.append((0, refused))
        for i, (args, _) in enumerate(commands):  # each QUEUED, or why it was refused
            try:
                await conn.read_response()
            except ResponseError as refused:
                self.annotate_exception(refused, i + 1, args)
                errors.append((i, refused))
        try:
            response = await conn.read_response()
        except ExecAbortError as abort:
            if errors:
                raise errors[0][1] from abort
            raise
        if response is None:
            raise WatchError("Watched variable changed.")
        for i, queued_error in errors:
            response.insert(i, queued_error)
        if len(response) != len(commands):
            await conn.disconnect()
            raise ResponseError("Wrong number of response items from pipeline execution")
        if raise_on_error:
            self.raise_first_error(commands, response)
        callbacks = self.response_callbacks
        return [
            reply if isinstance(reply, Exception) else await _with_callback(callbacks, args[0], reply, options)
            for reply, (args, options) in zip(response, commands, strict=True)
        ]
