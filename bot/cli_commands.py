"""What each ``botd`` subcommand does once the config is loaded."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path

from bot.config import BotdConfig
from bot.daemon import Daemon, settle_collector
from bot.store.connection import RedisHandle, open_redis
from bot.store.session_info import SessionInfo
from bot.tracing import TraceStore, render_trace


@asynccontextmanager
async def store(cfg: BotdConfig) -> AsyncIterator[RedisHandle]:
    """The configured Redis (joining, or starting, the embedded server)."""
    handle = await open_redis(cfg.redis, cfg.workspace)
    try:
        yield handle
    finally:
        await handle.close()


async def run(cfg: BotdConfig) -> int:
    await Daemon(cfg).run_until_signal()
    return 0


async def chat(cfg: BotdConfig, log_path: Path | None) -> int:
    from channels.console import ConsoleChannel

    if log_path is not None:
        print(f"starting… (logs: {log_path})", flush=True)
    console = ConsoleChannel()
    daemon = Daemon(cfg, channels={"console": console}, with_http=False, with_scheduler=False)
    await daemon.start()
    settle_collector()
    grace_s: float | None = None
    try:
        await console.closed.wait()
        if console.ended_by == "eof":
            await _wait_idle(daemon)  # piped input: answer the last message before leaving
        else:
            await console.stop_runs()  # /exit or Ctrl-C: leave now, without retrying the run later
            grace_s = 0.0
    finally:
        await daemon.stop(grace_s)
    return 0


async def _wait_idle(daemon: Daemon, timeout_s: float = 600.0) -> None:
    """After stdin closes, let the last message's run finish before exiting."""
    app = daemon.app
    if app is None:
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    await asyncio.sleep(0.2)
    while loop.time() < deadline and (await app.gateway.inbox.depth() or app.gateway.busy_locally()):
        await asyncio.sleep(0.1)


async def cron(cfg: BotdConfig, args: argparse.Namespace) -> int:
    from bot.store.seal import RecordSeal
    from scheduler import cron_commands as cc
    from scheduler.jobs import SchedulerNotRunningError
    from scheduler.schedules import CronError
    from scheduler.store import JobStore

    upcoming = None
    if args.cron_command == "next":
        upcoming = cc.NextQuery(job_id=args.id, cron=args.cron, every=args.every, at=args.at, tz=args.tz,
                                after=args.after, count=args.count)
        if args.id is None:  # an inline schedule needs no store
            try:
                print(cc.inline_next(upcoming, default_timezone=cfg.scheduler.timezone).render(args.json), end="")
            except CronError as exc:
                print(f"botd cron: {exc}", file=sys.stderr)
                return 2
            return 0
    async with store(cfg) as handle:
        jobs = JobStore(handle.client, handle.keys, RecordSeal.for_config(cfg))
        try:
            if args.cron_command == "add":
                options = cc.CronAddOptions(
                    prompt=args.prompt, channel=args.channel, chat_id=args.chat_id, thread_id=args.thread_id,
                    at=args.at, in_=args.in_, every=args.every, cron=args.cron, tz=args.tz,
                    allow=args.allow, job_id=args.job_id,
                )
                print(await cc.cron_add(jobs, options, default_timezone=cfg.scheduler.timezone))
            elif args.cron_command == "list":
                if args.json:
                    print(await cc.cron_list_json(jobs))
                else:
                    print(cc.format_job_table(await cc.cron_list(jobs)))
            elif args.cron_command == "rm":
                await cc.cron_remove(jobs, args.id)
                print(f"removed {args.id}")
            elif args.cron_command == "run-now":
                request_id = await cc.cron_run_now(jobs, args.id)
                print(f"requested {request_id}")
                if args.wait > 0:
                    record = await cc.wait_for_run(jobs, args.id, request_id, timeout_s=args.wait)
                    if record is None:
                        print("no result yet (is a daemon running?)", file=sys.stderr)
                        return 1
                    print(record.model_dump_json())
                    if (failure := cc.run_verdict(record)) is not None:
                        print(f"botd cron: {failure}", file=sys.stderr)
                        return 1
            elif upcoming is not None:
                fires = await cc.job_next(jobs, upcoming, default_timezone=cfg.scheduler.timezone)
                print(fires.render(args.json), end="")
        except SchedulerNotRunningError as exc:
            print(f"botd cron: {exc}", file=sys.stderr)
            return 1
        except CronError as exc:
            print(f"botd cron: {exc}", file=sys.stderr)
            return 2
    return 0


async def sessions(cfg: BotdConfig, args: argparse.Namespace) -> int:
    from bot.store.sessions import SessionStore

    async with store(cfg) as handle:
        sessions_store = SessionStore(handle.client, handle.keys)
        if args.sessions_command == "list":
            page = await sessions_store.list_sessions(limit=max(1, min(args.limit, 1000)))
            if args.json:
                for info in page.sessions:
                    print(json.dumps(info.model_dump(mode="json"), ensure_ascii=False))
            else:
                print(format_session_table(page.sessions))
        elif args.sessions_command == "show":
            info = await sessions_store.show(args.key)
            if not info.exists:
                print(f"no session {args.key}", file=sys.stderr)
                return 1
            print(json.dumps(info.model_dump(mode="json"), ensure_ascii=False, indent=2))
            for message in await sessions_store.history(args.key):
                print(message.model_dump_json(exclude_none=True))
        elif args.sessions_command == "reset":
            if not await sessions_store.reset(args.key):
                print(f"no session {args.key} (see `botd sessions list`)", file=sys.stderr)
                return 1
            print(f"reset {args.key}")
    return 0


def format_session_table(sessions: Sequence[SessionInfo]) -> str:
    """Sessions for humans: last activity in local time, message count, tokens."""
    if not sessions:
        return "No sessions."
    rows = [("LAST ACTIVITY", "MESSAGES", "TOKENS", "SESSION")]
    for info in sessions:
        rows.append((
            _local_time(info.last_activity), str(info.message_count),
            str(info.usage.total_prompt_tokens + info.usage.total_completion_tokens), info.session_key,
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def _local_time(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch).astimezone().strftime("%Y-%m-%d %H:%M %Z")


async def pairing(cfg: BotdConfig, args: argparse.Namespace) -> int:
    from bot.pairing import run_cli

    async with store(cfg) as handle:
        return await run_cli(handle.client, handle.keys, args, channels=["telegram", "slack"])


async def trace(cfg: BotdConfig, run_id: str) -> int:
    async with store(cfg) as handle:
        found = await TraceStore(handle.client, cfg.redis.prefix).load(run_id)
    if found is None:
        print(f"no trace for run {run_id}", file=sys.stderr)
        return 1
    print(render_trace(found))
    return 0
