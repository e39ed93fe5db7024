"""The daemon's side of the scheduler: fires run through the gateway like chat messages."""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from agent.types import DeliveryStatus, RunRequest
from bot.gateway.gateway import Gateway
from bot.gateway.run import RunOutcome
from channels.base import ChannelAdapter, Target
from scheduler.ports import JobTarget, ScheduledOutcome, ScheduledRunStatus

log = structlog.get_logger(__name__)

_RUN_STATUS: dict[str, ScheduledRunStatus] = {
    "completed": "ok",
    "max_iterations": "ok",
    "failed": "error",
    "cancelled": "error",
    "timeout": "timeout",
    "blocked": "skipped",
}


class GatewayScheduledRunner:
    def __init__(self, gateway: Gateway, channels: Mapping[str, ChannelAdapter]) -> None:
        self._gateway = gateway
        self._channels = channels

    async def run_scheduled(self, request: RunRequest, *, timeout_s: float) -> ScheduledOutcome:
        req = request.model_copy(update={"meta": {**request.meta, "timeout_s": str(timeout_s)}})
        if req.channel not in self._channels:
            return ScheduledOutcome(req.run_id, "error", "failed", f"channel {req.channel!r} is not enabled")
        accepted = await self._gateway.submit(req)
        if accepted.status in ("error", "dropped"):
            return ScheduledOutcome(req.run_id, "error", "unknown", f"not accepted: {accepted.detail}")
        if accepted.status == "duplicate":
            return ScheduledOutcome(req.run_id, "skipped", "unknown", "duplicate fire")
        outcome = await self._gateway.outcomes.wait(req.run_id, timeout_s + 30)
        if outcome is None:
            return ScheduledOutcome(req.run_id, "timeout", "unknown", "no outcome within the run timeout")
        return to_scheduled(outcome)

    async def is_busy(self, session_key: str) -> bool:
        return await self._gateway.is_busy(session_key)

    async def notify(self, target: JobTarget, text: str) -> None:
        channel = self._channels.get(target.channel)
        if channel is None:
            log.warning("scheduler.notify_no_channel", channel=target.channel)
            return
        await channel.send_text(Target(channel=target.channel, chat_id=target.chat_id, thread_id=target.thread_id), text)


def to_scheduled(outcome: RunOutcome) -> ScheduledOutcome:
    delivery: DeliveryStatus = outcome.delivery if outcome.delivery != "none" else "unknown"
    if outcome.status == "failed" and outcome.delivery == "none":
        delivery = "unknown"
    return ScheduledOutcome(outcome.run_id, _RUN_STATUS.get(outcome.status, "error"), delivery, outcome.error)
