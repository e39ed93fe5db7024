"""A run's outcome in the scheduler's words: every gateway status maps, and only into the ledger's."""

from __future__ import annotations

from typing import get_args

from bot.app import SCHEDULED_STATUS, scheduled_outcome
from bot.gateway.run_control import OutcomeStatus, RunOutcome
from scheduler.ports import RUN_STATUSES


def test_every_outcome_status_has_a_scheduled_status() -> None:
    assert set(SCHEDULED_STATUS) == set(get_args(OutcomeStatus))
    assert set(SCHEDULED_STATUS.values()) <= set(RUN_STATUSES)


def test_no_delivery_reads_as_unknown_and_an_unknown_status_as_an_error() -> None:
    assert scheduled_outcome(RunOutcome("r1", "blocked")).delivery_status == "unknown"
    assert scheduled_outcome(RunOutcome("r2", "completed", "silent")).delivery_status == "silent"
    written_by_a_newer_replica = RunOutcome("r3", "paused")  # type: ignore[arg-type]
    assert scheduled_outcome(written_by_a_newer_replica).run_status == "error"
