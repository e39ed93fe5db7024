"""Reply parts that failed after their immediate retries are delivered again later.

A part whose send failed stays in the delivery ledger (``failed:…``) and is queued in
Redis with what to send and where. Any replica's worker retries due parts with
exponential backoff for ``max_age_s`` (15 minutes by default), across restarts and
replicas; only then is the part given up: counted (``botd_deliveries_total`` with
outcome ``given_up``), logged, and the chat told once if anything can still be sent.

Exactly one worker handles a part at a time: it claims the part by moving its score a
lease ahead. The ledger state guards against duplicates: a part is marked
``resending`` before the send, so a worker that finds ``resending`` left by one that
died mid-send gives the part up rather than risk sending it twice; so does a send that
may have arrived (``DeliveryUnknown``). Neither tells the chat: the part may be out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Mapping

import redis.asyncio as aioredis
import structlog
from pydantic import TypeAdapter

from agent.tasks import stop_task
from agent.types import ChatRef
from bot import metrics
from bot.gateway.reply import DeliveryLedger, notify
from bot.store.keys import Keys
from channels.base import ChannelAdapter, DeliveryUnknown, Target

log = structlog.get_logger(__name__)

UNDELIVERED_TEXT = "Sorry — part of my answer could not be delivered here, even after retrying. Please ask again."

# Take a due part: only if it is still due, push its score a lease ahead (to ARGV[3]) under
# the token ARGV[4], atomic across replicas. A claim sent again after its reply was lost
# finds its own token and is still the claim (not another replica's).
_CLAIM = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return 0 end
if tonumber(score) > tonumber(ARGV[2]) then
  return redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[4] and 1 or 0
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
return 1
"""

Clock = Callable[[], float]
_CHAT: TypeAdapter[ChatRef] = TypeAdapter(ChatRef)


@dataclasses.dataclass
class PendingPart:
    run_id: str
    index: int
    text: str
    target: Target
    first_failed_at: float
    attempts: int = 0

    @property
    def member(self) -> str:
        return json.dumps([self.run_id, self.index])

    def dump(self) -> str:
        data = dataclasses.asdict(self)
        chat = self.target.chat
        data["target"]["chat"] = chat.model_dump(mode="json") if chat is not None else None
        return json.dumps(data)

    @classmethod
    def load(cls, raw: str) -> PendingPart:
        data = json.loads(raw)
        target = data["target"]
        chat = target.pop("chat", None)
        data["target"] = Target(**target, chat=_CHAT.validate_python(chat) if chat is not None else None)
        return cls(**data)


class Redelivery:
    """The retry queue of failed reply parts, and the worker that drains it."""

    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        channels: Mapping[str, ChannelAdapter],
        ledger: DeliveryLedger,
        *,
        max_age_s: float = 900.0,
        first_delay_s: float = 5.0,
        max_delay_s: float = 120.0,
        lease_s: float = 180.0,
        poll_s: float = 2.0,
        quiet_poll_s: float = 10.0,
        clock: Clock = time.time,
    ) -> None:
        self._r = client
        self._due = keys.redelivery_due()
        self._items = keys.redelivery_items()
        self._claims = keys.redelivery_claims()
        self._channels = channels
        self._ledger = ledger
        self.max_age_s = max_age_s
        self.first_delay_s = first_delay_s
        self.max_delay_s = max_delay_s
        self.lease_s = lease_s
        self.poll_s = poll_s
        # With the queue empty at the last look, the next is this far off unless this replica
        # defers a part meanwhile: another replica's parts are polled by that replica, this
        # one only stands in for it should it die.
        self.quiet_poll_s = quiet_poll_s
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._queue_empty = False  # at the last look
        self._deferred = asyncio.Event()

    async def defer(self, run_id: str, index: int, text: str, target: Target) -> None:
        """Queue a part whose send failed; its ledger entry says ``failed:…`` meanwhile."""
        part = PendingPart(run_id, index, text, target, self._clock())
        try:
            pipe = self._r.pipeline(transaction=True)
            pipe.hset(self._items, part.member, part.dump())
            pipe.zadd(self._due, {part.member: part.first_failed_at + self.first_delay_s})
            await pipe.execute()
        except Exception as exc:  # the part stays failed in the ledger
            log.error("delivery.defer_failed", run_id=run_id, part=index, error=str(exc))
            return
        self._deferred.set()
        log.info("delivery.deferred", run_id=run_id, part=index, retry_in_s=self.first_delay_s)

    async def pending(self) -> int:
        return int(await self._r.zcard(self._due))

    # -- the worker ----------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="redelivery")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)  # re-cancels: redis-py's retries can swallow a cancellation mid-command

    async def _loop(self) -> None:
        while True:
            self._deferred.clear()  # before the read: a part deferred during it ends the wait below
            try:
                await self.run_due()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: try again next round
                self._queue_empty = False
                log.warning("delivery.redelivery_error", error=str(exc))
            if not self._queue_empty:
                await asyncio.sleep(self.poll_s)
                continue
            with contextlib.suppress(TimeoutError):  # asyncio.timeout: never swallows a cancel, unlike wait_for
                async with asyncio.timeout(self.quiet_poll_s):
                    await self._deferred.wait()

    async def run_due(self, limit: int = 20) -> int:
        """Attempt every part that is due now; returns how many were attempted."""
        now = self._clock()
        # The earliest ``limit`` by due time (those due now are a prefix): one read also says
        # whether anything is queued at all.
        earliest: list[tuple[str, float]] = await self._r.zrange(self._due, 0, limit - 1, withscores=True)  # type: ignore[assignment]
        self._queue_empty = not earliest
        members = [str(member) for member, due in earliest if due <= now]
        handled = 0
        for member in members:
            token = uuid.uuid4().hex
            if not await self._r.eval(_CLAIM, 2, self._due, self._claims, member, now, now + self.lease_s, token):
                continue  # another replica took it
            raw = await self._r.hget(self._items, member)
            if raw is None:
                await self._r.zrem(self._due, member)
                await self._r.hdel(self._claims, member)
                continue
            handled += 1
            await self._attempt(PendingPart.load(str(raw)))
        return handled

    async def _attempt(self, part: PendingPart) -> None:
        key = str(part.index)
        state = (await self._ledger.states(part.run_id)).get(key, "")
        if state.startswith("sent:"):
            await self._drop(part)
            return
        if state in ("resending", "unknown"):  # a worker died mid-send: the part may be out already
            await self._give_up(part, "unknown")
            return
        channel = self._channels.get(part.target.channel)
        if channel is None:
            await self._give_up(part, "channel_disabled")
            return
        await self._ledger.mark(part.run_id, key, "resending")
        part.attempts += 1
        stream = channel.open_stream(part.target, part.run_id)
        try:
            message_id = await stream.deliver(part.index, part.text)
        except asyncio.CancelledError:
            await asyncio.shield(self._ledger.mark(part.run_id, key, "unknown"))
            raise
        except DeliveryUnknown:  # it may be out this time: never again
            await self._give_up(part, "unknown")
            return
        except Exception as exc:
            await self._ledger.mark(part.run_id, key, f"failed:{type(exc).__name__}")
            await self._reschedule(part, exc)
            return
        finally:
            with contextlib.suppress(Exception):
                await stream.close()
        await self._ledger.mark(part.run_id, key, f"sent:{message_id or ''}")
        await self._drop(part)
        metrics.DELIVERIES.labels(part.target.channel, "sent").inc()
        log.info("delivery.redelivered", run_id=part.run_id, part=part.index, attempts=part.attempts)

    async def _reschedule(self, part: PendingPart, exc: Exception) -> None:
        now = self._clock()
        deadline = part.first_failed_at + self.max_age_s
        if now >= deadline:
            await self._give_up(part, type(exc).__name__)
            return
        delay = min(self.max_delay_s, self.first_delay_s * 2 ** min(part.attempts, 16))
        at = min(now + delay, deadline)
        pipe = self._r.pipeline(transaction=True)
        pipe.hset(self._items, part.member, part.dump())
        pipe.zadd(self._due, {part.member: at})
        await pipe.execute()
        log.warning("delivery.retry_later", run_id=part.run_id, part=part.index, attempts=part.attempts,
                    retry_in_s=round(at - now, 1), error=str(exc))

    async def _drop(self, part: PendingPart) -> None:
        pipe = self._r.pipeline(transaction=True)
        pipe.zrem(self._due, part.member)
        pipe.hdel(self._items, part.member)
        pipe.hdel(self._claims, part.member)
        await pipe.execute()

    async def _give_up(self, part: PendingPart, reason: str) -> None:
        """Stop retrying ``part``. The chat is told it did not arrive, unless its last send
        may have arrived (``unknown``): the notice would then be wrong as often as right."""
        await self._drop(part)
        unknown = reason == "unknown"
        await self._ledger.mark(part.run_id, str(part.index), "unknown" if unknown else f"given_up:{reason}")
        metrics.DELIVERIES.labels(part.target.channel, "unknown" if unknown else "given_up").inc()
        log.error("delivery.given_up", run_id=part.run_id, part=part.index, attempts=part.attempts, reason=reason,
                  failing_for_s=round(self._clock() - part.first_failed_at))
        channel = self._channels.get(part.target.channel)
        if channel is not None and not unknown:
            await notify(channel, part.target, self._ledger, part.run_id, "undelivered", UNDELIVERED_TEXT)
