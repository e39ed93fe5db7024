"""One streamed model request, and what it would cost without the openai SDK's request layer.

botd talks to providers through the SDK (``LLMClient``) unless an alternative on the same
wire is at least 3× cheaper per request. This measures, against the fake OpenAI server in
its own process, the CPU of this process per request for:

* ``LLMClient.complete`` — what botd does (the SDK's ``post`` over ``agent.http``,
  then botd's SSE decoding and assembly);
* ``SDK post, body unread`` — the SDK's request layer alone, the body read raw;
* ``aiohttp, decoded`` — the same request with a bare ``aiohttp`` session and botd's
  decoder and assembler (the alternative);
* ``aiohttp, body unread`` — a bare request, the body read raw.

Rows alternate in rounds so the machine's drift falls on all of them alike.

    .venv/bin/python bench/llm_request.py [--requests 400] [--rounds 3]

Prints a table and writes bench/llm_request.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.llm import LLMClient
from agent.llm_stream import SSEDecoder, StreamAssembler, decode_json
from agent.types import Message
from bench.common import ROOT, fake_llm_subprocess, report_header, sdk_post_unread, table, write_json

OUTPUT = ROOT / "bench" / "llm_request.json"
PROMPT = "Tell me something about the sea."


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    async with fake_llm_subprocess() as llm, aiohttp.ClientSession() as session:
        client = LLMClient(model="bench", base_url=llm.base_url, api_key="bench", max_retries=0)
        messages = [Message.user(PROMPT)]
        body = orjson.dumps({"model": "bench", "messages": [{"role": "user", "content": PROMPT}],
                             "stream": True, "stream_options": {"include_usage": True}})
        url = llm.base_url + "/chat/completions"
        headers = {"Authorization": "Bearer bench", "Content-Type": "application/json"}

        async def botd() -> None:
            await client.complete(messages, [])

        async def sdk_raw() -> None:
            await sdk_post_unread(client, body)

        async def aiohttp_decoded() -> None:
            async with session.post(url, data=body, headers=headers) as response:
                decoder, assembler = SSEDecoder(), StreamAssembler()
                async for raw in response.content.iter_any():
                    for _event, data in decoder.feed(raw):
                        if not data.startswith("[DONE]"):
                            assembler.feed(decode_json(data))
                assembler.response(messages)

        async def aiohttp_raw() -> None:
            async with session.post(url, data=body, headers=headers) as response:
                async for _ in response.content.iter_any():
                    pass

        rows: dict[str, Callable[[], Awaitable[None]]] = {
            "LLMClient.complete": botd, "SDK post, body unread": sdk_raw,
            "aiohttp, decoded": aiohttp_decoded, "aiohttp, body unread": aiohttp_raw,
        }
        samples: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.rounds):
            for name, call in rows.items():
                for _ in range(30):
                    await call()
                start = time.process_time()
                for _ in range(args.requests):
                    await call()
                samples[name].append((time.process_time() - start) / args.requests * 1e6)
        await client.aclose()
    return {name: {"us_per_request": round(statistics.median(v), 1), "rounds": [round(x, 1) for x in v]}
            for name, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = asyncio.run(measure(args))
    botd = results["LLMClient.complete"]["us_per_request"]
    print(table(["request", "CPU µs per request (median of rounds)", "LLMClient ÷ this"],
                [[name, r["us_per_request"], round(botd / r["us_per_request"], 2)] for name, r in results.items()]))
    write_json(OUTPUT, {**report_header("llm_request", "bench/llm_request.py"), "results": results})


if __name__ == "__main__":
    main()
