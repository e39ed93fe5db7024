"""The pairing store on a real Redis, with a clock the tests move: codes, expiry, budgets,
approvals, denials, half-written state and the approval notice across replicas."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from bot.gateway.inbox import Deduper
from bot.pairing import (
    ALPHABET,
    APPROVED_TEXT,
    CODE_LENGTH,
    CODE_TTL_S,
    MAX_PENDING,
    MAX_REPLIES_PER_HOUR,
    ApprovalNotices,
    Challenge,
    ChannelPairing,
    PairingStore,
)
from bot.store.keys import Keys
from tests.fakes.lost_replies import LostReplies
from tests.fakes.recording_channel import RecordingChannel


class Clock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def keys(redis_prefix: str) -> Keys:
    return Keys(redis_prefix)


@pytest.fixture
def store(redis_client: aioredis.Redis, keys: Keys, clock: Clock) -> PairingStore:
    return PairingStore(redis_client, keys, clock)


async def test_a_code_is_short_unambiguous_and_repeated_while_it_lives(store: PairingStore, clock: Clock) -> None:
    first = await store.challenge("telegram", "42", "Ann", "42")
    assert first.reply and first.code is not None
    assert len(first.code) == CODE_LENGTH and set(first.code) <= set(ALPHABET)
    assert not set("01OIL") & set(ALPHABET)
    clock.now += CODE_TTL_S - 1
    again = await store.challenge("telegram", "42", "Ann", "42")
    assert again.code == first.code
    other = await store.challenge("slack", "42", "Ann", "D42")  # another channel, another user
    assert other.code != first.code


async def test_an_expired_code_cannot_be_approved_and_the_next_dm_gets_a_new_one(
    store: PairingStore, clock: Clock
) -> None:
    old = (await store.challenge("telegram", "42", "Ann", "42")).code
    assert old is not None
    clock.now += CODE_TTL_S
    assert await store.approve(old) is None
    assert await store.pending() == []
    new = (await store.challenge("telegram", "42", "Ann", "42")).code
    assert new not in (None, old)
    assert [r.code for r in await store.pending()] == [new]


async def test_replies_are_limited_per_user_and_hour(store: PairingStore, clock: Clock) -> None:
    answers = [await store.challenge("telegram", "42", "Ann", "42") for _ in range(MAX_REPLIES_PER_HOUR + 2)]
    assert [a.reply for a in answers] == [True] * MAX_REPLIES_PER_HOUR + [False, False]
    assert len({a.code for a in answers}) == 1
    assert (await store.challenge("telegram", "43", "Bob", "43")).reply  # per user
    clock.now += 3600
    assert (await store.challenge("telegram", "42", "Ann", "42")).reply  # the next hour


async def test_approval_is_kept_and_the_code_is_used_up(store: PairingStore) -> None:
    code = (await store.challenge("telegram", "42", "Ann", "42")).code
    assert code is not None
    assert not await store.is_approved("telegram", "42")
    request = await store.approve(f" {code[:4].lower()}-{code[4:]} ")  # as an owner may type it
    assert request is not None and (request.channel, request.user_id, request.chat_id) == ("telegram", "42", "42")
    assert await store.is_approved("telegram", "42")
    assert not await store.is_approved("slack", "42")
    assert await store.approve(code) is None
    assert [u.user_id for u in await store.approved("telegram")] == ["42"]
    assert await store.pending() == []
    assert await store.revoke("telegram", "42") and not await store.is_approved("telegram", "42")


async def test_a_denied_user_gets_no_reply_until_the_code_would_have_expired(store: PairingStore, clock: Clock) -> None:
    code = (await store.challenge("telegram", "42", "Ann", "42")).code
    assert code is not None
    assert await store.deny(code) is not None
    assert await store.challenge("telegram", "42", "Ann", "42") == Challenge(None, reply=False)
    assert await store.approve(code) is None and not await store.is_approved("telegram", "42")
    clock.now += CODE_TTL_S + 1
    await store._r.delete(store._keys.pairing_user("telegram", "42"))  # what Redis' TTL does by then
    assert (await store.challenge("telegram", "42", "Ann", "42")).code not in (None, code)


@pytest.mark.parametrize("hostile", ["", "*", "../../x", "A" * 9, "AAAA0000", "ÄÄÄÄÄÄÄÄ", "pairing:code:*"])
async def test_hostile_codes_match_nothing(store: PairingStore, hostile: str) -> None:
    await store.challenge("telegram", "42", "Ann", "42")
    assert await store.approve(hostile) is None
    assert await store.deny(hostile) is None
    assert not await store.is_approved("telegram", "42")


async def test_strangers_beyond_the_pending_cap_get_nothing(store: PairingStore) -> None:
    for user in range(MAX_PENDING):
        assert (await store.challenge("telegram", str(user), "", str(user))).code is not None
    late = await store.challenge("telegram", "late", "", "late")
    assert late.code is None and not late.reply


async def test_a_code_half_written_before_a_crash_is_replaced(
    store: PairingStore, redis_client: aioredis.Redis, keys: Keys
) -> None:
    # SIGKILL after the user's claim, before the code record: the claim points nowhere.
    await redis_client.set(keys.pairing_user("telegram", "42"), "ABCDEFGH")
    answer = await store.challenge("telegram", "42", "Ann", "42")
    assert answer.code not in (None, "ABCDEFGH") and answer.reply
    assert await store.approve("ABCDEFGH") is None


async def test_racing_dms_share_one_code(store: PairingStore) -> None:
    answers = await asyncio.gather(*(store.challenge("telegram", "42", "Ann", "42") for _ in range(5)))
    assert len({a.code for a in answers}) == 1
    assert len(await store.pending()) == 1


async def test_the_stranger_is_answered_in_their_chat_and_told_once_when_approved(
    store: PairingStore, redis_client: aioredis.Redis, keys: Keys
) -> None:
    telegram = RecordingChannel(name="telegram")
    gate = ChannelPairing(store, "telegram", {"telegram": telegram}, Deduper(redis_client, keys))
    await gate.challenge("42", "Ann", "42")
    [sent] = telegram.sent
    request = await store.approve(sent.text.split("code: ")[1][:CODE_LENGTH])
    assert request is not None and sent.chat_id == "42"
    # Two replicas hear the approval; the user hears it once.
    replicas = [ApprovalNotices(redis_client, keys, {"telegram": telegram}) for _ in range(2)]
    data = request.model_dump(mode="json")
    await asyncio.gather(*(r.on_event(data) for r in replicas))
    assert telegram.texts() == [sent.text, APPROVED_TEXT]
    assert await gate.is_approved("42")


async def test_a_store_failure_never_reaches_the_channel(redis_client: aioredis.Redis, keys: Keys) -> None:
    broken = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2, retry=None)
    telegram = RecordingChannel(name="telegram")
    try:
        gate = ChannelPairing(PairingStore(broken, keys), "telegram", {"telegram": telegram}, Deduper(broken, keys))
        await gate.challenge("42", "", "42")
    finally:
        await broken.aclose()
    assert telegram.sent == []


WRITES = ("SET", "EVAL", "EVALSHA")  # the reads before each write are retried harmlessly


@pytest.mark.parametrize("marker", [":pairing:code:", ":pairing:user:", ":pairing:notified:"])
async def test_writes_retried_after_a_lost_reply_still_count_as_made(
    store_client: aioredis.Redis, keys: Keys, clock: Clock, monkeypatch: pytest.MonkeyPatch, marker: str
) -> None:
    # The store applies a set-if-absent and its reply is lost; redis-py sends it again.
    telegram = RecordingChannel(name="telegram")
    store = PairingStore(store_client, keys, clock)
    lost = LostReplies(monkeypatch, marker, 1, commands=WRITES)
    answer = await store.challenge("telegram", "42", "Ann", "42")
    assert answer.code is not None and answer.reply, "the stranger would get no code"
    request = await store.approve(answer.code)
    assert request is not None
    await ApprovalNotices(store_client, keys, {"telegram": telegram}).on_event(request.model_dump(mode="json"))
    assert telegram.texts() == [APPROVED_TEXT], "the approved user would not be told"
    assert lost.lost == 1


async def test_a_reply_counted_again_after_a_lost_reply_counts_once(
    store_client: aioredis.Redis, keys: Keys, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Counted twice, the stranger would run out of code replies early.
    store = PairingStore(store_client, keys, clock)
    lost = LostReplies(monkeypatch, ":pairing:repl", MAX_REPLIES_PER_HOUR)
    answers = [await store.challenge("telegram", "42", "Ann", "42") for _ in range(MAX_REPLIES_PER_HOUR + 1)]
    assert lost.lost == MAX_REPLIES_PER_HOUR
    assert [a.reply for a in answers] == [True] * MAX_REPLIES_PER_HOUR + [False]


async def test_a_flood_keeps_the_reply_count_bounded(store: PairingStore, keys: Keys, clock: Clock,
                                                     redis_client: aioredis.Redis) -> None:
    for _ in range(50):
        await store.challenge("telegram", "42", "Ann", "42")
    replied = keys.pairing_replied("telegram", "42", str(int(clock.now // 3600)))
    assert await redis_client.scard(replied) == MAX_REPLIES_PER_HOUR
    assert 0 < await redis_client.ttl(replied) <= 2 * 3600


async def test_a_strangers_name_cannot_drive_the_owners_terminal(store: PairingStore) -> None:
    await store.challenge("telegram", "42", "Eve\x1b]0;pwned\x07\x1b[2J" + "x" * 500, "42")
    [request] = await store.pending()
    assert request.user_name.startswith("Eve ]0;pwned  [2J") and len(request.user_name) == 100
    assert all(ch.isprintable() for ch in request.user_name)
