"""A recording ScheduledRunner for the scheduler tests (and a check that it records)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.types import RunRequest
from scheduler.ports import JobTarget, ScheduledOutcome


@dataclass
class RecordingRunner:
    """Answers every run with ``status``/``delivery``; records requests, busy checks and notices."""

    status: str = "ok"
    delivery: str = "delivered"
    error: str | None = None
    raise_error: Exception | None = None
    delay_s: float = 0.0
    busy: Callable[[str], bool] = lambda key: False
    requests: list[RunRequest] = field(default_factory=list)
    timeouts: list[float] = field(default_factory=list)
    busy_checks: list[str] = field(default_factory=list)
    notices: list[tuple[JobTarget, str]] = field(default_factory=list)

    async def run_scheduled(self, request: RunRequest, *, timeout_s: float) -> ScheduledOutcome:
        self.requests.append(request)
        self.timeouts.append(timeout_s)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.raise_error is not None:
            raise self.raise_error
        return ScheduledOutcome(
            run_id=request.run_id,
            run_status=self.status,  # type: ignore[arg-type]
            delivery_status=self.delivery,  # type: ignore[arg-type]
            error=self.error,
        )

    async def is_busy(self, session_key: str) -> bool:
        self.busy_checks.append(session_key)
        return self.busy(session_key)

    async def notify(self, target: JobTarget, text: str) -> None:
        self.notices.append((target, text))


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0, interval_s: float = 0.02) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes; returns its last value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() >= deadline:
            return predicate()
        await asyncio.sleep(interval_s)
    return True


async def test_recording_runner_records_and_answers() -> None:
    runner = RecordingRunner(status="error", error="boom", busy=lambda key: key == "x")
    request = RunRequest(session_key="s", channel="telegram", chat_id="1", text="hi")
    outcome = await runner.run_scheduled(request, timeout_s=5)
    assert (outcome.run_status, outcome.error, outcome.run_id) == ("error", "boom", request.run_id)
    assert await runner.is_busy("x") and not await runner.is_busy("y")
    assert runner.requests == [request] and runner.timeouts == [5]
