"""Files in: a Telegram update with a 5 MB photo or a 10 MB document until the LLM request.

One daemon in this process (the real Telegram adapter polling the fake Bot API, the real
gateway, the embedded Valkey, the fake OpenAI server), as ``botd run`` would run it. Each
sample pushes one update (from a new person: a fresh session) to the fake and times until the fake LLM receives the request
that carries the file's attachment line: long-poll wake-up, submit, the worker, getFile,
the streamed download into ``inbox/``, then the request. The photo is measured with
``llm.vision`` off and on (on adds Pillow's decode, downscale to 1568 px and re-encode).

Memory: with ``tracemalloc`` on, the peak of Python allocations above the level before
the update was pushed, over the whole path (the fake's stored file is allocated
before): what botd holds while the file streams to disk. A download read whole would
add at least the file's size.

    .venv/bin/python bench/attachments.py [--samples 20]

Prints a table and writes bench/attachments.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import logging
import random
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import structlog
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
# bench/telegram.py is named like the python-telegram-bot package: keep this directory off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import mib, report_header, summary_ms, table, temp_workspace, write_json  # noqa: E402
from bot.config import BotdConfig  # noqa: E402
from channels.telegram.adapter import TelegramChannel  # noqa: E402
from channels.telegram.settings import TelegramSettings  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI, Reply  # noqa: E402
from tests.fakes.telegram_server import FakeTelegram  # noqa: E402
from tests.integration.files_rig import running  # noqa: E402

OUTPUT = ROOT / "bench" / "attachments.json"
PHOTO_BYTES = 5 * 1024 * 1024
DOCUMENT_BYTES = 10 * 1024 * 1024


def photo_of_about(size: int) -> bytes:
    """A noisy JPEG of about ``size`` bytes (noise does not compress: a camera-like file)."""
    rnd = random.Random(1)
    side = int((size / 1.1) ** 0.5 * 0.9)
    while True:
        img = Image.frombytes("RGB", (side, side * 3 // 4), rnd.randbytes(side * (side * 3 // 4) * 3))
        out = io.BytesIO()
        img.save(out, format="JPEG", quality=90)
        if out.tell() >= size * 0.95:
            return out.getvalue()
        side = int(side * 1.1)


class Arrivals:
    """The fake LLM's responder: notes when each request arrived."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.event = asyncio.Event()

    async def __call__(self, body: dict[str, Any]) -> Reply:
        self.times.append(time.perf_counter())
        self.event.set()
        return Reply.text("ok")


@contextlib.asynccontextmanager
async def daemon(workspace: Path, *, vision: bool) -> AsyncIterator[tuple[FakeTelegram, Arrivals]]:
    arrivals = Arrivals()
    async with FakeOpenAI(responder=arrivals) as llm, FakeTelegram() as tg:
        cfg = BotdConfig.model_validate({
            "agent": {"workspace": str(workspace)},
            "llm": {"base_url": llm.base_url, "api_key": "bench", "vision": vision},
            "queue": {"debounce_ms": 0},
            "attachments": {"max_bytes": 20 * 1024 * 1024},
        })
        channel = TelegramChannel(TelegramSettings(
            token=tg.token, api_base_url=tg.base_url, dm_policy="open", poll_timeout_s=10,
            poll_backoff_s=0.05, typing_interval_s=5.0,
        ))
        async with running(cfg, "telegram", channel):
            yield tg, arrivals


_users = itertools.count(1000)


async def one(tg: FakeTelegram, arrivals: Arrivals, media: dict[str, Any]) -> float:
    """One update from a new person (a fresh session, so no history) until its LLM request."""
    arrivals.event.clear()
    before = len(arrivals.times)
    started = time.perf_counter()
    tg.push_message(tg.private_message(next(_users), caption="what is in this file?", media=media))
    while len(arrivals.times) == before:
        await asyncio.wait_for(arrivals.event.wait(), 30)
        arrivals.event.clear()
    return arrivals.times[before] - started


async def measure(name: str, data: bytes, kind: str, samples: int, *, vision: bool) -> dict[str, Any]:
    with temp_workspace() as workspace:
        async with daemon(workspace, vision=vision) as (tg, arrivals):

            def media() -> dict[str, Any]:
                if kind == "photo":
                    return tg.photo_media(data, width=4000, height=3000)
                return tg.document_media(data, "report.pdf", "application/pdf")

            await one(tg, arrivals, media())  # warm-up
            latencies = [await one(tg, arrivals, media()) for _ in range(samples)]
            peaks = []
            for _ in range(3):
                prepared = media()
                tracemalloc.start()
                baseline = tracemalloc.get_traced_memory()[0]
                await one(tg, arrivals, prepared)
                peaks.append(tracemalloc.get_traced_memory()[1] - baseline)
                tracemalloc.stop()
    return {"case": name, "file_bytes": len(data), "vision": vision, **summary_ms(latencies),
            "peak_python_mib": round(mib(max(peaks)), 2)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    photo = photo_of_about(PHOTO_BYTES)
    document = random.Random(2).randbytes(DOCUMENT_BYTES)
    results = [
        await measure("photo 5 MB", photo, "photo", args.samples, vision=False),
        await measure("photo 5 MB, vision", photo, "photo", args.samples, vision=True),
        await measure("document 10 MB", document, "document", args.samples, vision=False),
    ]
    return {**report_header("attachments", "bench/attachments.py"), "samples": args.samples, "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    report = asyncio.run(main_async(args))
    rows = [
        (r["case"], f"{r['file_bytes'] / 2**20:.1f} MiB", r["p50_ms"], r["p90_ms"], r["max_ms"], r["peak_python_mib"])
        for r in report["results"]
    ]
    print(table(["case", "file", "p50 ms", "p90 ms", "max ms", "peak MiB (Python)"], rows))
    write_json(OUTPUT, report)


if __name__ == "__main__":
    main()
