"""``botd status``: what runs and what waits, read from the store in one short visit.

Daemons report themselves with a heartbeat (:mod:`bot.replicas`), so status needs no
connection to any of them: it reads the store, bounded by :data:`BUDGET_S`, and says so
when the store does not answer. It imports only light modules so it returns quickly.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from datetime import datetime
from typing import Any

from bot import __version__
from bot.config import BotdConfig
from bot.replicas import live_replicas
from bot.store.connection import RedisHandle, open_redis, redact_url
from bot.store.errors import StoreError

BUDGET_S = 1.5  # the whole store visit; the command stays under 2 s
MAX_CRON_SHOWN = 5
MAX_WAITING_SCANNED = 1000


def describe_setup(cfg: BotdConfig) -> str:
    """Which config and store a command uses (``--verbose``, the header of ``botd status``)."""
    source = str(cfg.source) if cfg.source is not None else "none (defaults and environment)"
    return f"config: {source}\nstore: {_store_text(cfg)}\nworkspace: {cfg.workspace}"


def _store_text(cfg: BotdConfig) -> str:
    where = f"Redis at {redact_url(cfg.redis.url)}" if cfg.redis.url else f"embedded Valkey in {cfg.workspace / '.botd'}"
    return f"{where}, prefix {cfg.redis.prefix!r}"


def channel_config(cfg: BotdConfig) -> dict[str, dict[str, Any]]:
    """Every channel, enabled or not, with the settings that decide who it answers."""
    tg, sl = cfg.telegram, cfg.slack
    return {
        "telegram": {"enabled": tg.enabled, "mode": tg.mode, "dm_policy": tg.dm_policy,
                     "allow_from": len(tg.allow_from), "groups": len(tg.groups)},
        "slack": {"enabled": sl.enabled, "mode": sl.mode, "dm_policy": sl.dm_policy,
                  "allow_from": len(sl.allow_from), "channels": len(sl.channels)},
    }


def sandbox_state(cfg: BotdConfig) -> dict[str, Any]:
    # security.sandbox exists only in builds with the tool sandbox; older configs lack the key.
    mode = getattr(cfg.security, "sandbox", None)
    bwrap = shutil.which("bwrap") is not None
    if mode is None:
        return {"mode": "none", "bwrap": bwrap, "note": "tools run with botd's user rights"}
    return {"mode": str(mode), "bwrap": bwrap}


async def collect(cfg: BotdConfig) -> dict[str, Any]:
    """The whole report as JSON-ready data."""
    report: dict[str, Any] = {
        "version": __version__,
        "config": str(cfg.source) if cfg.source is not None else None,
        "store": {"url": redact_url(cfg.redis.url) if cfg.redis.url else None, "embedded": not cfg.redis.url,
                  "prefix": cfg.redis.prefix, "workspace": str(cfg.workspace), "ok": False},
        "channels": channel_config(cfg),
        "sandbox": sandbox_state(cfg),
    }
    try:
        async with asyncio.timeout(BUDGET_S):
            handle = await open_redis(cfg.redis, cfg.workspace, open_timeout_s=BUDGET_S)
            try:
                report.update(await _from_store(handle))
            finally:
                await handle.close()
        report["store"]["ok"] = True
    except TimeoutError:
        report["store"]["error"] = f"the store did not answer within {BUDGET_S:g} s"
    except (StoreError, OSError) as exc:
        report["store"]["error"] = str(exc)
    return report


async def _from_store(handle: RedisHandle) -> dict[str, Any]:
    from scheduler.cron_commands import cron_list
    from scheduler.store import JobStore

    client, keys = handle.client, handle.keys
    daemons = await live_replicas(client, keys)
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.session_index())
    pipe.zrange(keys.pending(), 0, MAX_WAITING_SCANNED - 1)
    sessions, waiting = await pipe.execute()
    queued = 0
    if waiting:
        pipe = client.pipeline(transaction=False)
        for session in waiting:
            pipe.llen(keys.inbox(str(session)))
        queued = sum(int(n) for n in await pipe.execute())
    rows = await cron_list(JobStore(client, keys))
    upcoming = sorted((r for r in rows if r["enabled"] and r["next_run"]), key=lambda r: r["next_run"])
    return {
        "daemons": daemons,
        "sessions": int(sessions),
        "waiting_sessions": len(waiting),
        "queued_messages": queued,
        "active_runs": sum(int(d.get("active_runs") or 0) for d in daemons),
        "cron_jobs": len(rows),
        "next_cron": [{"id": r["id"], "next_run": r["next_run"], "schedule": r["schedule"],
                       "target": r["target"]} for r in upcoming[:MAX_CRON_SHOWN]],
    }


def render(cfg: BotdConfig, report: dict[str, Any], now: float | None = None) -> str:
    now = time.time() if now is None else now
    lines = [f"botd {report['version']}", describe_setup(cfg), ""]
    store = report["store"]
    if not store["ok"]:
        lines.append(f"store: not available: {store.get('error', 'unknown error')}")
    daemons = report.get("daemons", [])
    if store["ok"]:
        lines.append(f"daemons: {len(daemons)} running" if daemons else "daemons: none running (start one: botd run)")
    for d in daemons:
        up = _ago(now - float(d.get("started_at", now)))
        port = f", http :{d['http_port']}" if d.get("http_port") else ""
        chans = ", ".join(f"{name} {'ready' if ok else 'down'}" for name, ok in sorted(d.get("channels", {}).items()))
        lines.append(f"  {d.get('replica')}  botd {d.get('mode', 'run')} {d.get('version', '?')}, up {up}{port}, "
                     f"channels: {chans or 'none'}, active runs {d.get('active_runs', 0)}, "
                     f"seen {_ago(now - float(d.get('seen_at', now)))} ago")
    lines.append("channels:")
    for name, c in report["channels"].items():
        if not c["enabled"]:
            lines.append(f"  {name}: disabled")
            continue
        ready = [bool(d.get("channels", {}).get(name)) for d in daemons if name in d.get("channels", {})]
        state = "no daemon" if not ready else f"ready on {sum(ready)} of {len(ready)} daemon(s)"
        lines.append(f"  {name}: enabled, {c['mode']}, dm_policy {c['dm_policy']}, {state}")
    if store["ok"]:
        lines.append(f"sessions: {report['sessions']}, queued messages: {report['queued_messages']} "
                     f"(in {report['waiting_sessions']} sessions), active runs: {report['active_runs']}")
        if report["next_cron"]:
            lines.append(f"next cron fires ({report['cron_jobs']} jobs):")
            for job in report["next_cron"]:
                t = job["target"]
                lines.append(f"  {_local(job['next_run'])}  {job['id']}  {job['schedule']}  "
                             f"{t['channel']}:{t['chat_id']}")
        else:
            lines.append(f"next cron fires: none ({report['cron_jobs']} jobs)")
    sb = report["sandbox"]
    note = f" ({sb['note']})" if sb.get("note") else ""
    lines.append(f"sandbox: {sb['mode']}{note}; bubblewrap {'installed' if sb['bwrap'] else 'not installed'}")
    return "\n".join(lines)


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def _local(iso: str) -> str:
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone().strftime("%Y-%m-%d %H:%M %Z")
    except ValueError:
        return iso


async def status(cfg: BotdConfig, *, as_json: bool = False) -> int:
    report = await collect(cfg)
    if as_json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print(render(cfg, report))
    if not report["store"]["ok"]:
        print(f"botd status: {report['store'].get('error')}", file=sys.stderr)
        return 1
    return 0
