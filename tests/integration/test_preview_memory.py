"""A run's preview record: a first attempt never asks the store, a resumed one does (also
in the passes that follow it until one has read the record), and what this process
stored itself is carried in memory between the passes of one attempt."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from channels.preview_memory import PreviewBook
from tests.fakes.store_requests import StoreRequests
from tests.fakes.telegram_context import RedisKV


@pytest.fixture
def kv(redis_client: aioredis.Redis, redis_prefix: str) -> RedisKV:
    return RedisKV(redis_client, redis_prefix)


async def left_by_a_dead_attempt(kv: RedisKV, run_id: str, chat_id: str = "42", message_id: str = "900") -> None:
    """What the attempt that died stored (another process: a book of its own)."""
    await PreviewBook(kv, "telegram").memory(run_id, chat_id).remember(message_id)


async def test_a_first_attempt_asks_the_store_nothing(kv: RedisKV, monkeypatch: pytest.MonkeyPatch) -> None:
    book = PreviewBook(kv, "telegram")
    requests = StoreRequests(monkeypatch)
    memory = book.memory("run-1", "42", resumed=False)
    assert await memory.recall() is None
    await memory.remember("501")
    await memory.forget()
    assert requests.commands(":preview:run-1") == ["SET", "DEL"]


async def test_a_resumed_attempt_finds_what_the_dead_one_left(kv: RedisKV, monkeypatch: pytest.MonkeyPatch) -> None:
    await left_by_a_dead_attempt(kv, "run-2")
    requests = StoreRequests(monkeypatch)
    memory = PreviewBook(kv, "telegram").memory("run-2", "42", resumed=True)
    assert await memory.recall() == "900"
    assert await memory.recall() is None  # asked once per stream
    assert requests.commands(":preview:run-2") == ["GET"]


async def test_a_record_of_another_chat_is_not_adopted(kv: RedisKV) -> None:
    await left_by_a_dead_attempt(kv, "run-3", chat_id="43")
    assert await PreviewBook(kv, "telegram").memory("run-3", "42").recall() is None


async def test_a_pass_after_a_resumed_one_that_never_looked_still_asks_the_store(kv: RedisKV) -> None:
    await left_by_a_dead_attempt(kv, "run-4")
    book = PreviewBook(kv, "telegram")
    book.memory("run-4", "42", resumed=True)  # restarted (more messages came) before it looked
    folded = book.memory("run-4", "42", resumed=False)  # the restart is not "resumed" any more
    assert await folded.recall() == "900"
    # Once read, the record is this process's knowledge: a further pass asks nothing.
    assert await book.memory("run-4", "42", resumed=False).recall() == "900"


async def test_a_pass_after_one_that_settled_the_preview_finds_nothing(
    kv: RedisKV, monkeypatch: pytest.MonkeyPatch
) -> None:
    await left_by_a_dead_attempt(kv, "run-5")
    book = PreviewBook(kv, "telegram")
    resumed = book.memory("run-5", "42", resumed=True)
    assert await resumed.recall() == "900"
    await resumed.forget()  # deleted (or turned into the answer)
    requests = StoreRequests(monkeypatch)
    assert await book.memory("run-5", "42", resumed=False).recall() is None
    assert requests.count == 0


async def test_a_preview_this_process_left_is_carried_to_the_next_pass(
    kv: RedisKV, monkeypatch: pytest.MonkeyPatch
) -> None:
    book = PreviewBook(kv, "telegram")
    await book.memory("run-6", "42", resumed=False).remember("777")  # its delete failed: not forgotten
    requests = StoreRequests(monkeypatch)
    assert await book.memory("run-6", "42", resumed=False).recall() == "777"
    assert requests.count == 0


async def test_a_preview_is_carried_even_when_the_store_would_not_take_it(kv: RedisKV) -> None:
    class Down(RedisKV):
        async def set(self, key: str, value: str, ttl_s: float | None = None) -> None:
            raise ConnectionError("Redis is down")

    book = PreviewBook(Down(kv.client, kv.prefix), "telegram")
    await book.memory("run-7", "42", resumed=False).remember("778")
    assert await book.memory("run-7", "42", resumed=False).recall() == "778"


async def test_a_failed_lookup_is_tried_again_by_the_next_pass(kv: RedisKV) -> None:
    await left_by_a_dead_attempt(kv, "run-8")

    class Flaky(RedisKV):
        failures = 1

        async def get(self, key: str) -> str | None:
            if self.failures:
                self.failures -= 1
                raise ConnectionError("Redis is down")
            return await super().get(key)

    book = PreviewBook(Flaky(kv.client, kv.prefix), "telegram")
    assert await book.memory("run-8", "42", resumed=True).recall() is None  # best effort: no preview
    assert await book.memory("run-8", "42", resumed=False).recall() == "900"


async def test_the_book_keeps_the_newest_runs_only(kv: RedisKV) -> None:
    book = PreviewBook(kv, "telegram", capacity=2)
    for n in range(3):
        await book.memory(f"run-9-{n}", "42", resumed=False).remember(str(n))
    assert book.carried("run-9-0") is None  # the oldest went first
    assert (book.carried("run-9-1"), book.carried("run-9-2")) == ("42:1", "42:2")


async def test_without_a_store_nothing_is_remembered() -> None:
    memory = PreviewBook(None, "telegram").memory("run-10", "42")
    await memory.remember("1")
    assert await memory.recall() is None
    await memory.forget()


async def test_forget_deletes_only_a_record_that_may_exist(kv: RedisKV, monkeypatch: pytest.MonkeyPatch) -> None:
    requests = StoreRequests(monkeypatch)
    book = PreviewBook(kv, "telegram")
    never_stored = book.memory("run-11", "42", resumed=False)
    assert await never_stored.recall() is None
    await never_stored.forget()
    assert requests.count == 0  # nothing was stored, nothing found: nothing to delete

    class Flaky(RedisKV):
        async def get(self, key: str) -> str | None:
            raise ConnectionError("Redis is down")

    unknown = PreviewBook(Flaky(kv.client, kv.prefix), "telegram").memory("run-12", "42", resumed=True)
    assert await unknown.recall() is None
    await unknown.forget()  # the lookup failed: a record may be there
    assert requests.commands(":preview:run-12") == ["DEL"]
