"""The store client's own CPU: botd's client (``LeanRedis``) against redis-py's own path.

botd's client sends a command or a pipeline and reads its replies straight off the
connection (``bot.store.pool``); redis-py's path runs each through its parsing layers,
HIMPORT checks and observability recorders. Both use botd's connection class and pool,
against the embedded Valkey (unix socket) started in a temporary workspace as botd
starts it. Measured: CPU of this process per call (the server's is not counted), for a
GET, a three-command pipeline, and a six-command transaction shaped like a run's steps
(SET, GET, EVAL, HGETALL, LRANGE, EXPIRE). Rows alternate in rounds, so the machine's
drift falls on all of them alike.

    .venv/bin/python bench/store_client.py [--calls 2000] [--rounds 5]

Prints a table and writes bench/store_client.json.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, cpu_per_call, report_header, table, temp_workspace, write_json
from bot.config import RedisConfig
from bot.store import open_redis
from bot.store.pool import BoundedConnectionPool

OUTPUT = ROOT / "bench" / "store_client.json"
VALUE = "x" * 300
OPERATIONS = ("GET", "pipeline of 3", "transaction of 6")


def calls(client: aioredis.Redis) -> dict[str, Callable[[], Awaitable[Any]]]:
    async def get() -> Any:
        return await client.get("bench:a")

    async def pipeline() -> Any:
        pipe = client.pipeline(transaction=False)
        pipe.set("bench:a", VALUE, px=100_000)
        pipe.get("bench:a")
        pipe.hgetall("bench:h")
        return await pipe.execute()

    async def transaction() -> Any:
        pipe = client.pipeline(transaction=True)
        pipe.set("bench:a", VALUE, px=100_000)
        pipe.get("bench:a")
        pipe.eval("return 1", 0)
        pipe.hgetall("bench:h")
        pipe.lrange("bench:l", 0, -1)
        pipe.expire("bench:a", 100)
        return await pipe.execute()

    return dict(zip(OPERATIONS, (get, pipeline, transaction), strict=True))


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    with temp_workspace("botd-bench-store-client-") as workspace:
        handle = await open_redis(RedisConfig(), workspace)
        pool = handle.client.connection_pool  # the same connection settings, redis-py's client on them
        plain = aioredis.Redis.from_pool(
            BoundedConnectionPool(connection_class=pool.connection_class, **pool.connection_kwargs)
        )
        try:
            clients = {"botd's client": calls(handle.client), "redis-py's path": calls(plain)}
            for own, other in zip(clients["botd's client"].values(), clients["redis-py's path"].values(), strict=True):
                assert await own() == await other(), "both clients must read the same replies"
            rows = {f"{op}, {who}": ops[op] for op in OPERATIONS for who, ops in clients.items()}
            results = await cpu_per_call(rows, calls=args.calls, rounds=args.rounds, warmup=50, key="us_per_call")
        finally:
            await plain.aclose()
            await handle.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results = asyncio.run(measure(args))
    print(table(["call", "CPU µs per call (median of rounds)"], [[name, r["us_per_call"]] for name, r in results.items()]))
    write_json(OUTPUT, {**report_header("store_client", "bench/store_client.py"), "results": results})


if __name__ == "__main__":
    main()
