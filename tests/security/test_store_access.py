"""The embedded store: a password no tool can read, and private files."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

from bot.config import RedisConfig
from bot.store.connection import open_redis
from bot.store.embedded import EmbeddedPaths
from bot.store.valkey_process import probe


async def test_the_embedded_store_refuses_a_client_without_the_password(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    paths = EmbeddedPaths.for_workspace(ws)
    handle = await open_redis(RedisConfig(prefix="sec"), ws)
    try:
        await handle.client.set("sec:k", "v")
        reply = probe(paths.socket)  # what a process on the socket without the password gets
        assert reply is not None and reply.startswith(b"-NOAUTH")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            sock.connect(str(paths.socket))
            sock.sendall(b"*2\r\n$3\r\nGET\r\n$5\r\nsec:k\r\n")
            assert sock.recv(256).startswith(b"-NOAUTH")
        assert stat.S_IMODE(paths.password.stat().st_mode) == 0o600
        assert stat.S_IMODE(paths.root.stat().st_mode) == 0o700
        assert stat.S_IMODE(paths.data_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE(paths.config.stat().st_mode) == 0o600
        assert paths.password.read_text().strip() not in handle.url
    finally:
        await handle.close()
