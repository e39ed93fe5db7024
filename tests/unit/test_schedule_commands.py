"""The ``botd cron`` helpers and the run requests a cron fire produces."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis

from bot.store.keys import Keys
from scheduler.cron_commands import (
    CronAddOptions,
    cron_add,
    cron_list,
    cron_list_json,
    cron_remove,
    cron_run_now,
    format_job_table,
    wait_for_run,
)
from scheduler.fires import cron_run_request
from scheduler.jobs import DuplicateJobError, InvalidJobError, JobNotFoundError, SchedulerNotRunningError
from scheduler.schedules import CronError, ScheduleError
from scheduler.store import JobStore, RunLedger

NOW = datetime(2027, 3, 26, 12, 0, tzinfo=UTC)


def clock() -> datetime:
    return NOW


def options(**fields: object) -> CronAddOptions:
    values: dict[str, object] = {
        "prompt": "Post the standup summary",
        "channel": "telegram",
        "chat_id": "-100123",
    }
    values.update(fields)
    return CronAddOptions(**values)  # type: ignore[arg-type]


async def test_add_every_form_and_list(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))
    ids = [
        await cron_add(store, options(in_="20m", job_id="soon"), clock=clock),
        await cron_add(store, options(at="2027-03-28T09:00", tz="Europe/Berlin"), clock=clock),
        await cron_add(store, options(every="1h", allow="write,admin"), clock=clock),
        await cron_add(
            store,
            options(cron="0 9 * * 0", channel="slack", chat_id="C1", thread_id="17.1"),
            default_timezone="Europe/Berlin",
            clock=clock,
        ),
    ]
    assert ids[0] == "soon" and len(set(ids)) == 4
    rows = {row["id"]: row for row in await cron_list(store, clock=clock)}
    assert rows["soon"]["next_run"] == "2027-03-26T12:20:00Z"
    assert rows[ids[1]]["next_run"] == "2027-03-28T07:00:00Z"  # 09:00 CEST
    assert rows[ids[2]]["allow"] == ["write", "admin"]
    assert rows[ids[2]]["next_run"] == "2027-03-26T13:00:00Z"
    sunday = rows[ids[3]]
    assert sunday["next_run"] == "2027-03-28T07:00:00Z"  # Sunday 09:00 Berlin, after the DST change
    assert sunday["schedule"] == "cron 0 9 * * 0 (Europe/Berlin)"
    assert sunday["target"] == {"channel": "slack", "chat_id": "C1", "thread_id": "17.1"}
    assert sunday["created_by"] == "cli" and sunday["created_in"] is None
    as_json = json.loads(await cron_list_json(store, clock=clock))
    assert {row["id"] for row in as_json} == set(ids)
    table = format_job_table(await cron_list(store, clock=clock))
    assert table.splitlines()[0].split() == [
        "ID",
        "STATE",
        "SCHEDULE",
        "NEXT",
        "RUN",
        "(UTC)",
        "LAST",
        "TARGET",
        "PROMPT",
    ]
    assert "slack:C1/17.1" in table and "2027-03-28 07:00:00" in table
    assert format_job_table([]) == "No cron jobs."


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"in_": "20m", "every": "1h"}, ScheduleError, "exactly one schedule"),
        ({}, ScheduleError, "exactly one schedule"),
        ({"in_": "soon"}, ScheduleError, "in: not a duration"),
        ({"at": "2020-01-01T00:00:00Z"}, ScheduleError, "in the past"),
        ({"cron": "0 9 * * 8"}, ScheduleError, "day-of-week value 8"),
        ({"cron": "0 9 * * *", "tz": "Europe/Berlinn"}, ScheduleError, "tz: unknown IANA timezone"),
        ({"in_": "5m", "channel": "discord"}, InvalidJobError, "channel: 'discord' is not a chat channel"),
        ({"in_": "5m", "channel": "cron"}, InvalidJobError, "not a chat channel"),
        ({"in_": "5m", "chat_id": " "}, InvalidJobError, "chat-id: required"),
        ({"in_": "5m", "prompt": "  "}, InvalidJobError, "prompt: required"),
        ({"in_": "5m", "prompt": "x" * 8001}, InvalidJobError, "prompt: too long"),
        ({"in_": "5m", "allow": "write,sudo"}, InvalidJobError, "unknown tool category 'sudo'"),
        ({"in_": "5m", "job_id": "heartbeat"}, InvalidJobError, "reserved"),
        ({"in_": "5m", "job_id": "no spaces"}, InvalidJobError, "is not valid"),
    ],
)
async def test_add_rejects_bad_input_and_stores_nothing(
    redis_client: aioredis.Redis,
    redis_prefix: str,
    fields: dict[str, object],
    error: type[CronError],
    message: str,
) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))
    with pytest.raises(error, match=message):
        await cron_add(store, options(**fields), clock=clock)
    assert await store.list() == []


async def test_add_duplicate_id(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))
    await cron_add(store, options(every="1h", job_id="standup"), clock=clock)
    with pytest.raises(DuplicateJobError):
        await cron_add(store, options(every="2h", job_id="standup"), clock=clock)


async def test_remove_and_run_now(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))
    job_id = await cron_add(store, options(every="1h"), clock=clock)
    with pytest.raises(SchedulerNotRunningError, match="no running daemon .* nothing was requested"):
        await cron_run_now(store, job_id, clock=clock)
    assert await store.run_now_queue.pending() == 0
    daemon = redis_client.pubsub()  # what a running scheduler holds
    await daemon.subscribe(store.changes_channel)
    try:
        request_id = await cron_run_now(store, job_id, clock=clock)
        queued = await store.run_now_queue.pop()
        assert queued is not None and (queued.job_id, queued.request_id) == (job_id, request_id)
        assert await cron_run_now(store, "heartbeat", clock=clock)
        with pytest.raises(JobNotFoundError, match="no cron job with id 'nope'"):
            await cron_run_now(store, "nope", clock=clock)
    finally:
        await daemon.aclose()
    await cron_remove(store, job_id)
    with pytest.raises(JobNotFoundError):
        await cron_remove(store, job_id)


async def test_wait_for_run_finds_the_ledger_entry(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))

    async def later() -> None:
        await asyncio.sleep(0.2)
        await store.ledger.append(
            RunLedger.skipped("job1", "x", at=NOW, fire_time=NOW, trigger="run_now", request_id="other")
        )
        await store.ledger.append(
            RunLedger.skipped("job1", "y", at=NOW, fire_time=NOW, trigger="run_now", request_id="mine")
        )

    task = asyncio.create_task(later())
    found = await wait_for_run(store, "job1", "mine", timeout_s=5, poll_s=0.05)
    await task
    assert found is not None and found.error == "y"
    assert await wait_for_run(store, "job1", "missing", timeout_s=0.2, poll_s=0.05) is None


async def test_cron_run_request_shape(redis_client: aioredis.Redis, redis_prefix: str) -> None:
    store = JobStore(redis_client, Keys(redis_prefix))
    job_id = await cron_add(
        store,
        options(
            cron="0 9 * * 1-5",
            tz="Europe/Berlin",
            allow="write",
            channel="slack",
            chat_id="C9",
            thread_id="171.5",
            created_by="U1",
        ),
        clock=clock,
    )
    job = await store.get(job_id)
    assert job is not None
    fire = datetime(2027, 3, 29, 7, 0, tzinfo=UTC)
    request = cron_run_request(
        job,
        agent_id="main",
        session_key=f"agent:main:cron:{job_id}",
        fire_time=fire,
        trigger="schedule",
        request_id=None,
        now=fire + timedelta(seconds=1),
    )
    assert (request.channel, request.chat_id, request.thread_id) == ("slack", "C9", "171.5")
    assert (request.kind, request.prompt_mode, request.session_key) == (
        "cron",
        "minimal",
        f"agent:main:cron:{job_id}",
    )
    assert request.tool_policy.context == "scheduled" and request.tool_policy.allow == ("write",)
    assert request.meta == {
        "fresh_session": "1",
        "job_id": job_id,
        "fire_time": "2027-03-29T07:00:00Z",
        "trigger": "schedule",
        "created_by": "U1",
    }
    assert request.user_id == ""
    assert request.dedupe_key == f"cron:{job_id}:2027-03-29T07:00:00Z"
    assert f'Cron job "{job_id}"' in request.text and "slack chat C9 (thread 171.5)" in request.text
    assert "2027-03-29 09:00 CEST" in request.text and "NO_REPLY" in request.text
    assert request.text.endswith("Post the standup summary")
    again = cron_run_request(
        job, agent_id="main", session_key="k", fire_time=fire, trigger="run_now", request_id="abc", now=fire
    )
    assert again.dedupe_key == f"cron:{job_id}:run_now:abc" and again.meta["request_id"] == "abc"
