"""open_redis: the embedded server's start/reuse/stop, URL mode, and clear errors."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from bot.config import RedisConfig
from bot.store import StoreConfigError, StoreUnavailable, open_redis, redact_url
from bot.store.embedded import EmbeddedPaths, EmbeddedValkey
from bot.store.valkey_process import probe, send_shutdown

REPO = Path(__file__).resolve().parents[2]


def _workspace(tmp_path: Path) -> Path:
    # Short, so the socket path stays within the unix socket limit on any tmp dir.
    return tmp_path / "ws"


def _server_running(paths: EmbeddedPaths) -> bool:
    reply = probe(paths.socket, paths.password.read_text().strip())
    return reply is not None and reply.startswith(b"+PONG")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_embedded_start_reuse_stop(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    paths = EmbeddedPaths.for_workspace(ws)
    first = await open_redis(RedisConfig(prefix="p1"), ws)
    try:
        assert first.embedded and first.started_server
        assert first.prefix == "p1" and first.keys.prefix == "p1"
        assert paths.socket == ws.resolve() / ".botd" / "valkey.sock"
        assert stat.S_ISSOCK(paths.socket.stat().st_mode)
        assert stat.S_IMODE(paths.socket.stat().st_mode) == 0o700
        assert first.url.startswith("unix://")
        await first.client.set("p1:k", "v")

        second = await open_redis(RedisConfig(prefix="p1"), ws)
        assert second.embedded and not second.started_server
        assert await second.client.get("p1:k") == "v"
        await second.close()
        assert _server_running(paths), "closing a reusing handle must not stop the server"
        assert await first.ping()
        assert await first.client.get("p1:k") == "v"

        aof_files = list(paths.aof_dir.glob("*.aof"))
        assert aof_files, "AOF must be on"
        assert "appendonly" in (await first.client.config_get("appendonly"))
        assert (await first.client.config_get("appendonly"))["appendonly"] == "yes"
        assert (await first.client.config_get("port"))["port"] == "0"
    finally:
        await first.close()
    assert not _server_running(paths)
    assert not paths.socket.exists()
    await first.close()  # closing twice is harmless


async def test_embedded_data_survives_restart(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    handle = await open_redis(RedisConfig(), ws)
    await handle.client.set("botd:persisted", "yes")
    await handle.close()
    assert not _server_running(EmbeddedPaths.for_workspace(ws))

    again = await open_redis(RedisConfig(), ws)
    try:
        assert again.started_server
        assert await again.client.get("botd:persisted") == "yes"
    finally:
        await again.close()


async def test_last_user_stops_even_when_the_starter_left_first(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    paths = EmbeddedPaths.for_workspace(ws)
    starter = await open_redis(RedisConfig(), ws)
    joiner = await open_redis(RedisConfig(), ws)
    await starter.close()
    assert _server_running(paths), "the starter must not pull the server from under another user"
    assert await joiner.ping()
    await joiner.client.set("botd:k", "1")
    await joiner.close()
    assert not _server_running(paths)


async def test_concurrent_joins_start_exactly_one_server(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    members = [EmbeddedValkey(ws) for _ in range(4)]
    barrier = threading.Barrier(len(members))

    def join(member: EmbeddedValkey) -> bool:
        barrier.wait()
        return member.join()

    started = await asyncio.gather(*(asyncio.to_thread(join, m) for m in members))
    try:
        assert sorted(started) == [False, False, False, True]
        assert _server_running(members[0].paths)
    finally:
        stopped = [await asyncio.to_thread(m.leave) for m in members]
    assert stopped == [False, False, False, True]
    assert not _server_running(members[0].paths)


async def test_stale_socket_and_pidfile_are_cleared(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    paths = EmbeddedPaths.for_workspace(ws)
    paths.data_dir.mkdir(parents=True)
    # A socket file nobody listens on, and a pid file naming a live process that is no Valkey.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(paths.socket))
    dead.close()
    paths.pidfile.write_text(str(os.getpid()))
    handle = await open_redis(RedisConfig(), ws)
    try:
        assert handle.started_server and await handle.ping()
    finally:
        await handle.close()


async def test_socket_path_too_long_is_a_config_error(tmp_path: Path) -> None:
    ws = tmp_path / ("w" * 120)
    with pytest.raises(StoreConfigError, match="socket path"):
        await open_redis(RedisConfig(), ws)
    assert not ws.exists(), "nothing is created when the settings cannot work"


def _result(out: str) -> str:
    return next((line[7:] for line in out.splitlines() if line.startswith("RESULT:")), "")


async def _read_result(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    while True:
        line = await asyncio.to_thread(child.stdout.readline)
        if not line or line.startswith("RESULT:"):
            return line[7:].strip()


def _child(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


CHILD = """
    import asyncio, sys
    from pathlib import Path
    from bot.config import RedisConfig
    from bot.store import open_redis

    async def main() -> None:
        handle = await open_redis(RedisConfig(), Path(sys.argv[1] if len(sys.argv) > 1 else {ws!r}))
        await handle.client.incr("botd:children")
        print("RESULT:" + ("started" if handle.started_server else "joined"), flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        await handle.close()

    asyncio.run(main())
"""


async def test_cli_process_stops_the_server_it_started_but_not_one_it_joined(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    paths = EmbeddedPaths.for_workspace(ws)
    # A process that finds no server starts one and stops it again on exit.
    child = _child(CHILD.format(ws=str(ws)))
    out, _ = await asyncio.to_thread(child.communicate, "\n", 60)
    assert _result(out) == "started" and child.returncode == 0
    assert not _server_running(paths)

    # A process that joins ours leaves it running on exit.
    handle = await open_redis(RedisConfig(), ws)
    try:
        child = _child(CHILD.format(ws=str(ws)))
        out, _ = await asyncio.to_thread(child.communicate, "\n", 60)
        assert _result(out) == "joined" and child.returncode == 0
        assert await handle.ping()
        assert await handle.client.get("botd:children") == "2"
    finally:
        await handle.close()


async def test_server_of_a_killed_process_is_adopted_and_stopped_by_the_last_user(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    paths = EmbeddedPaths.for_workspace(ws)
    child = _child(CHILD.format(ws=str(ws)))
    assert await _read_result(child) == "started"
    child.send_signal(signal.SIGKILL)
    await asyncio.to_thread(child.wait, 30)
    assert _server_running(paths), "the server runs in its own session and outlives a killed botd"

    handle = await open_redis(RedisConfig(), ws)
    assert not handle.started_server
    assert await handle.client.get("botd:children") == "1"
    await handle.close()
    assert not _server_running(paths)


async def test_url_mode_connects_to_the_given_server(redis_url: str, tmp_path: Path) -> None:
    handle = await open_redis(RedisConfig(url=redis_url, prefix="urlmode"), tmp_path)
    try:
        assert not handle.embedded and not handle.started_server
        assert await handle.ping()
        await handle.client.set("urlmode:k", "v", ex=10)
    finally:
        await handle.close()
    assert not (tmp_path / ".botd").exists(), "URL mode never starts an embedded server"
    again = await open_redis(RedisConfig(url=redis_url), tmp_path)
    try:
        assert await again.client.get("urlmode:k") == "v"
    finally:
        await again.close()


async def test_unreachable_url_raises_with_the_password_redacted(tmp_path: Path) -> None:
    url = f"redis://:s3cret-pw@127.0.0.1:{_free_port()}/0"
    with pytest.raises(StoreUnavailable) as info:
        await open_redis(RedisConfig(url=url), tmp_path)
    message = str(info.value)
    assert "s3cret-pw" not in message and "s3cret-pw" not in info.value.url
    assert "redis://:***@127.0.0.1" in message


async def test_missing_unix_socket_raises_with_the_password_redacted(tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/nothing.sock?password=s3cret-pw"
    with pytest.raises(StoreUnavailable) as info:
        await open_redis(RedisConfig(url=url), tmp_path)
    assert "s3cret-pw" not in str(info.value)
    assert "password=***" in str(info.value)


async def test_unsupported_scheme_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(StoreConfigError, match="redis://, rediss:// or unix://"):
        await open_redis(RedisConfig(url="http://user:s3cret-pw@localhost:6379"), tmp_path)


async def test_ping_is_false_once_the_server_is_gone(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    handle = await open_redis(RedisConfig(), ws)
    assert await handle.ping()
    paths = EmbeddedPaths.for_workspace(ws)
    await asyncio.to_thread(send_shutdown, paths.socket, paths.password.read_text().strip())
    assert not await handle.ping(timeout_s=3)
    await handle.close()  # stopping an already stopped server is not an error


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://user:pw@h/1", "redis://user:***@h/1"),
        ("rediss://pw@h", "rediss://***@h"),
        ("redis://u:p@ss@h", "redis://u:***@h"),
        ("unix:///run/r.sock?db=1&password=pw", "unix:///run/r.sock?db=1&password=***"),
        ("redis://h:6379", "redis://h:6379"),
        ("unix:///tmp/a b.sock", "unix:///tmp/a b.sock"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


async def test_a_server_that_never_answers_times_out_clearly(tmp_path: Path) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    port = silent.getsockname()[1]
    try:
        with pytest.raises(StoreUnavailable, match="did not answer within 1 s") as info:
            await open_redis(
                RedisConfig(url=f"redis://u:s3cret-pw@127.0.0.1:{port}"), tmp_path, open_timeout_s=1
            )
        assert "s3cret-pw" not in str(info.value)
    finally:
        silent.close()


# -- the bounded pool ----------------------------------------------------------------------


async def test_a_burst_of_commands_shares_a_bounded_number_of_connections(redis_url: str) -> None:
    from bot.store.connection import create_client

    client = create_client(redis_url, max_connections=3)
    try:
        results = await asyncio.gather(*(client.incr("pool-test:burst") for _ in range(300)))
        assert sorted(results) == list(range(1, 301))  # every command ran, none failed
        pool = client.connection_pool
        assert len(pool._available_connections) + len(pool._in_use_connections) <= 3
    finally:
        await client.delete("pool-test:burst")
        await client.aclose()


async def test_the_default_client_answers_a_burst_from_a_few_dozen_sockets(redis_url: str) -> None:
    # A webhook burst of a hundred updates used to open a socket per concurrent command:
    # ~16 KiB each in botd and more in the server, kept for the process's life.
    from bot.store.connection import create_client

    client = create_client(redis_url)
    try:
        results = await asyncio.gather(*(client.incr("pool-test:default-burst") for _ in range(300)))
        assert sorted(results) == list(range(1, 301))
        pool = client.connection_pool
        assert len(pool._available_connections) + len(pool._in_use_connections) <= 32
    finally:
        await client.delete("pool-test:default-burst")
        await client.aclose()


async def test_a_command_that_finds_no_free_connection_fails_clearly_in_time(redis_url: str) -> None:
    from bot.store.pool import BoundedConnectionPool

    pool = BoundedConnectionPool.from_url(redis_url, max_connections=1, wait_s=0.2, decode_responses=True)
    held = await pool.get_connection()
    try:
        with pytest.raises(Exception, match="no Redis connection came free within 0.2 s"):
            await pool.get_connection()
    finally:
        await pool.release(held)
        await pool.aclose()


async def test_a_cancelled_waiter_passes_its_turn_on(redis_url: str) -> None:
    from bot.store.pool import BoundedConnectionPool

    pool = BoundedConnectionPool.from_url(redis_url, max_connections=1, wait_s=5, decode_responses=True)
    held = await pool.get_connection()
    first = asyncio.create_task(pool.get_connection())
    second = asyncio.create_task(pool.get_connection())
    await asyncio.sleep(0.05)
    await pool.release(held)  # wakes the first waiter...
    first.cancel()  # ...which is cancelled before it runs: the second must get the connection
    conn = await asyncio.wait_for(second, 2)
    assert first.cancelled() or first.exception() is None
    await pool.release(conn)
    if not first.cancelled() and first.exception() is None:
        await pool.release(first.result())
    await pool.aclose()


async def test_waiters_are_served_in_order_and_a_cancelled_one_leaves_no_trace(redis_url: str) -> None:
    from bot.store.pool import BoundedConnectionPool

    pool = BoundedConnectionPool.from_url(redis_url, max_connections=1, wait_s=5, decode_responses=True)
    held = await pool.get_connection()
    gone = asyncio.create_task(pool.get_connection())
    await asyncio.sleep(0.02)
    gone.cancel()  # cancelled while waiting, never woken
    await asyncio.gather(gone, return_exceptions=True)
    order: list[int] = []

    async def take(i: int) -> None:
        conn = await pool.get_connection()
        order.append(i)
        await asyncio.sleep(0.01)
        await pool.release(conn)

    tasks = [asyncio.create_task(take(i)) for i in range(5)]
    await asyncio.sleep(0.02)
    await pool.release(held)
    await asyncio.wait_for(asyncio.gather(*tasks), 3)
    assert order == [0, 1, 2, 3, 4]
    # Nothing is left waiting: a fresh command finds the free connection at once.
    await asyncio.wait_for(pool.release(await pool.get_connection()), 1)
    await pool.aclose()


async def test_a_missing_or_wrong_password_is_named_at_once(tmp_path: Path) -> None:
    server = EmbeddedValkey(_workspace(tmp_path))  # the embedded server requires its password
    server.join()
    try:
        for url in (f"unix://{server.paths.socket}", f"unix://:not-it@{server.paths.socket}"):
            # Named as a password problem, not retried into "did not answer within 10 s".
            with pytest.raises(StoreUnavailable, match="refused the password") as info:
                await open_redis(RedisConfig(url=url), tmp_path)
            assert "redis.url" in str(info.value) and "not-it" not in str(info.value)
    finally:
        server.leave()
