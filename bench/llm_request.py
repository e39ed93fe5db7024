"""One streamed model request: what botd sends, and what the openai SDK's request layer costs.

botd talks to providers as the SDK would, but sends the request itself unless only the
SDK knows the way (``agent.llm_wire``): the issue's rule is that an alternative on the
same wire must be at least 3× cheaper per request. This measures, against the fake
OpenAI server in its own process, the CPU of this process per request for:

* ``LLMClient.complete`` — botd's whole call, straight over ``agent.http`` (its route
  unless a proxy, a redirect or SDK-side auth sends it through the SDK);
* ``LLMClient.complete, through the SDK`` — the same call on the SDK's route;
* ``SDK post, body unread`` — the SDK's request layer alone, the body read raw;
* ``agent.http, body unread`` — the same request with the SDK's headers, straight.

Rows alternate in rounds so the machine's drift falls on all of them alike.

    .venv/bin/python bench/llm_request.py [--requests 400] [--rounds 3]

Prints a table and writes bench/llm_request.json.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.http import HTTPClient
from agent.llm import LLMClient
from agent.types import Message
from bench.common import (
    ROOT,
    cpu_per_call,
    fake_llm_subprocess,
    report_header,
    sdk_post_unread,
    table,
    write_json,
)

OUTPUT = ROOT / "bench" / "llm_request.json"
PROMPT = "Tell me something about the sea."


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    async with fake_llm_subprocess() as llm:
        client = LLMClient(model="bench", base_url=llm.base_url, api_key="bench", max_retries=0)
        through_sdk = LLMClient(model="bench", base_url=llm.base_url, api_key="bench", max_retries=0)
        through_sdk._wire._direct = None  # the route a proxy or a redirect would choose
        messages = [Message.user(PROMPT)]
        body = orjson.dumps({"model": "bench", "messages": [{"role": "user", "content": PROMPT}],
                             "stream": True, "stream_options": {"include_usage": True}})
        route = client._wire._direct
        assert route is not None, "the fake's address should be reached straight"
        url, headers = route
        http = HTTPClient()

        async def botd() -> None:
            await client.complete(messages, [])

        async def botd_sdk() -> None:
            await through_sdk.complete(messages, [])

        async def sdk_raw() -> None:
            await sdk_post_unread(client, body)

        async def straight_raw() -> None:
            response = await http.request("POST", url, headers, body)
            async for _ in response:
                pass

        rows: dict[str, Callable[[], Awaitable[None]]] = {
            "LLMClient.complete": botd, "LLMClient.complete, through the SDK": botd_sdk,
            "SDK post, body unread": sdk_raw, "agent.http, body unread": straight_raw,
        }
        results = await cpu_per_call(rows, calls=args.requests, rounds=args.rounds, warmup=30, key="us_per_request")
        await client.aclose()
        await through_sdk.aclose()
        await http.aclose()
    return results


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
