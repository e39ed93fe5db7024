"""The whole daemon, with the store's replies lost at random.

Any request the daemon sends may be applied by the store and its reply lost (the store
stopped or the connection dropped in between); redis-py then sends it again. Whatever is
lost, every message is answered, exactly once, and the history holds each turn once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tests.fakes.lost_replies import LostReplies
from tests.fakes.openai_server import FakeOpenAI
from tests.integration.gateway_harness import Bot, dm_session, roles, running_daemon, wait_until

RATE = 0.1  # of the requests under the test's prefix, each way of sending them
CHATS = ("201", "202", "203")
TURNS = 12


@contextlib.asynccontextmanager
async def losing_replies(
    tmp_path: Path, redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, seed: int
) -> AsyncIterator[tuple[Bot, LostReplies]]:
    """A running daemon, with ``RATE`` of its store requests losing their reply."""
    async with FakeOpenAI() as fake, running_daemon(tmp_path, fake, redis_url, redis_prefix) as bot:
        yield bot, LostReplies(monkeypatch, redis_prefix + ":", 10**6, rate=RATE, seed=seed)


async def settle(bot: Bot, client: aioredis.Redis, lost: LostReplies) -> None:
    """Wait until every chat is idle, then stop losing replies (the checks read the store).
    The wait goes through a client of the test's own: the daemon's loses replies, and this
    wait is not what is tested."""
    for chat in CHATS:
        sk = dm_session(chat)

        async def idle(sk: str = sk) -> bool:
            busy = await client.exists(bot.keys.inbox(sk), bot.keys.running(sk), bot.keys.lock(sk))
            return not busy and sk not in bot.gateway.workers.tasks

        await wait_until(idle, timeout=30, what=f"session {sk} to become idle")
    lost.left = 0


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_every_message_is_answered_once_whatever_replies_are_lost(
    tmp_path: Path, redis_url: str, redis_prefix: str, redis_client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch,
    seed: int,
) -> None:
    async with losing_replies(tmp_path, redis_url, redis_prefix, monkeypatch, seed) as (bot, lost):
        def answers(chat: str) -> list[str]:
            return [s.text for s in bot.channel.sent if s.chat_id == chat and s.kind == "part"]

        async def converse(chat: str) -> None:
            for turn in range(TURNS):
                text = f"chat {chat} turn {turn}"
                await bot.send(text, chat_id=chat)
                await bot.channel.wait_for(lambda ch, text=text: text in answers(chat), timeout=30)

        await asyncio.gather(*(converse(chat) for chat in CHATS))
        await settle(bot, redis_client, lost)
        assert lost.lost >= 10, f"only {lost.lost} replies were lost: the test proves little"
        assert bot.channel.texts("notice") == []
        for chat in CHATS:
            assert answers(chat) == [f"chat {chat} turn {turn}" for turn in range(TURNS)]
            history = await bot.sessions.history(dm_session(chat))
            assert roles(history) == ["user", "assistant"] * TURNS


@pytest.mark.parametrize("seed", [4, 5])
async def test_messages_in_bursts_each_reach_the_model_once_whatever_replies_are_lost(
    tmp_path: Path, redis_url: str, redis_prefix: str, redis_client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch,
    seed: int,
) -> None:
    # Bursts: messages that arrive during a run are folded or steered into it (takes).
    async with losing_replies(tmp_path, redis_url, redis_prefix, monkeypatch, seed) as (bot, lost):
        sent: dict[str, list[str]] = {chat: [] for chat in CHATS}

        async def burst(chat: str) -> None:
            for round_ in range(4):
                for n in range(3):
                    text = f"chat {chat} round {round_} message {n}"
                    sent[chat].append(text)
                    await bot.send(text, chat_id=chat)  # no dedupe key, as on the console
                await asyncio.sleep(0.05)

        await asyncio.gather(*(burst(chat) for chat in CHATS))
        await settle(bot, redis_client, lost)
        assert bot.channel.texts("notice") == []
        for chat in CHATS:
            history = await bot.sessions.history(dm_session(chat))
            said = [m.content for m in history if m.role == "user"]
            twice = sorted({t for t in said if said.count(t) > 1})
            missing = sorted(set(sent[chat]) - set(said))
            assert sorted(said) == sorted(sent[chat]), f"lost {missing}, taken twice {twice}"
        assert lost.lost >= 5, f"only {lost.lost} replies were lost: the test proves little"
