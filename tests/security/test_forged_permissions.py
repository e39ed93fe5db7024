"""A process that writes to the store cannot approve an admin call nor widen a cron job's grants.

The attacker here is anything with store access (a tool with the sandbox off, or
with network and an external Redis): it writes the records directly.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from bot.config import BotdConfig
from bot.store.keys import Keys
from bot.store.seal import RecordSeal
from scheduler.jobs import CronJob
from scheduler.ports import JobTarget
from scheduler.schedules import parse_every
from scheduler.store import JobStore
from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.integration.gateway_harness import running_daemon
from tests.integration.test_gateway_approvals import TOOLS_YAML


async def test_an_approval_written_into_the_store_does_not_count(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    tools = tmp_path / "cli_tools.yaml"
    tools.write_text(TOOLS_YAML)
    async with (
        FakeOpenAI() as fake,
        running_daemon(tmp_path, fake, redis_url, redis_prefix, security={"cli_tools_file": str(tools)}) as bot,
    ):
        fake.script(Reply.tool_calls([Call("deploy", {"service": "web"})]), Reply.text("not deployed"))
        await bot.send("deploy web please")
        await bot.channel.wait_for(lambda ch: ch.approvals)
        [(approval_id, _)] = bot.channel.approvals
        key = f"{redis_prefix}:approval:{approval_id}"
        record = json.loads(await bot.redis.get(key))
        record.update(status="approved", by="100", mac="0" * 64)
        await bot.redis.set(key, json.dumps(record), keepttl=True)
        await bot.redis.publish(f"{redis_prefix}:approvals", json.dumps({"id": approval_id}))
        await bot.channel.wait_for(lambda ch: ch.texts("part"))
        await bot.wait_idle()
        assert not (bot.cfg.workspace / "deployed-web").exists()
        tool_results = [m for m in fake.requests[1]["messages"] if m["role"] == "tool"]
        assert "denied" in str(tool_results[0]["content"])


def _job(allow: tuple[str, ...]) -> CronJob:
    return CronJob(
        id="nightly", schedule=parse_every("1h", now=datetime.now(UTC)), prompt="report", allow=allow,
        target=JobTarget(channel="telegram", chat_id="42"), created_at=datetime.now(UTC),
    )


async def test_cron_grants_widened_in_the_store_are_dropped(tmp_path: Path, redis_client: object, redis_prefix: str) -> None:
    cfg = BotdConfig.model_validate({"agent": {"workspace": str(tmp_path / "ws")}})
    store = JobStore(redis_client, Keys(redis_prefix), RecordSeal.for_config(cfg))
    await store.add(_job(("write",)))
    assert (await store.get("nightly")).allow == ("write",)  # type: ignore[union-attr]
    key = store.job_key("nightly")
    stored = json.loads(await redis_client.get(key))  # type: ignore[attr-defined]
    stored["allow"] = ["write", "admin"]
    await redis_client.set(key, json.dumps(stored))  # type: ignore[attr-defined]
    tampered = await store.get("nightly")
    assert tampered is not None and tampered.allow == ()
    assert tampered.tool_policy().allow == ()
    # A job planted from scratch (no MAC at all) gets no grants either.
    planted = _job(("write", "admin")).model_copy(update={"id": "planted"})
    await redis_client.set(store.job_key("planted"), planted.model_dump_json())  # type: ignore[attr-defined]
    got = await store.get("planted")
    assert got is not None and got.allow == ()
    # Another daemon key (another deployment) does not verify either.
    other = JobStore(redis_client, Keys(redis_prefix), RecordSeal(b"another-key-0123456789"))
    again = await other.get("nightly")
    assert again is not None and again.allow == ()
