"""The floor under a message's CPU: the client libraries' calls alone, nothing of botd's.

A message on the Telegram polling path makes three Bot API calls through
python-telegram-bot (the ``getUpdates`` that brings it, ``sendChatAction``,
``sendMessage``), one streamed model request as ``LLMClient`` sends it (the ``openai``
SDK's headers, ``agent.llm_wire``) and three round trips
to the store (``bench/paths.py`` counts them). This makes exactly those calls, the way
botd makes them and on botd's event loop (uvloop), with nothing in between: the fakes
run in their own processes, the store is the embedded Valkey behind botd's own client.
What it measures per message, the CPU of this process plus the store server's, is what
the libraries and the store cost however lean botd's own code were; ``paths.py``'s
sequential CPU per message on the same machine, less this, is botd's own share.

Each step is timed on its own (rows alternate in rounds, so the machine's drift falls
on all of them alike), then all five in a message's order.

    .venv/bin/python bench/floor.py [--messages 300] [--rounds 3] [--output bench/floor.json]

Prints a table and writes bench/floor.json.
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

import orjson

# bench/ holds a telegram.py, named like python-telegram-bot: keep the directory off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    ROOT,
    child_pid,
    fake_llm_subprocess,
    fake_telegram_subprocess,
    proc_cpu,
    report_header,
    sdk_post_unread,
    table,
    temp_workspace,
    write_json,
)

OUTPUT = ROOT / "bench" / "floor.json"
CHAT = 42
STORE_ROUND_TRIPS = 3
ANSWER = "Here is the <b>answer</b>, short as most chat answers are."

async def measure(args: argparse.Namespace) -> dict[str, Any]:
    from telegram import ReplyParameters

    from agent.llm import LLMClient
    from bot.config import RedisConfig
    from bot.store import open_redis
    from channels.telegram.settings import TelegramSettings
    from channels.telegram.startup import make_bot

    calls_per_row = args.rounds * (args.messages + args.warmup)
    updates = calls_per_row * 2  # getUpdates alone, then in the whole message
    with temp_workspace("botd-bench-floor-") as workspace:
        async with fake_telegram_subprocess(updates) as (base_url, token, _), fake_llm_subprocess() as llm:
            store = await open_redis(RedisConfig(), workspace)
            server_pid = child_pid("valkey-server")
            bot = make_bot(TelegramSettings(token=token, api_base_url=base_url))  # botd's Bot and pools
            await bot.initialize()
            model = LLMClient(model="bench", base_url=llm.base_url, api_key="bench", max_retries=0)
            body = orjson.dumps({"model": "bench", "messages": [{"role": "user", "content": "message 1"}],
                                 "stream": True, "stream_options": {"include_usage": True}})
            offset = [0]
            last_message = [1]

            async def get_updates() -> None:
                got = await bot.get_updates(offset=offset[0] or None, limit=1, timeout=25,
                                            allowed_updates=["message"])
                if len(got) != 1 or got[0].message is None:
                    raise RuntimeError(f"getUpdates brought {len(got)} updates, expected one message")
                offset[0] = got[0].update_id + 1
                last_message[0] = got[0].message.message_id

            async def typing() -> None:
                await bot.send_chat_action(CHAT, "typing")

            async def send() -> None:
                # As botd's TelegramSender: Bot._post, the answer's message id read, no Message built.
                result = await bot._post("sendMessage", {
                    "chat_id": CHAT, "text": ANSWER, "parse_mode": "HTML",
                    "reply_parameters": ReplyParameters(last_message[0], allow_sending_without_reply=True),
                })
                if not isinstance(result, dict) or type(result.get("message_id")) is not int:
                    raise RuntimeError("sendMessage answered without a message id")

            async def model_request() -> None:
                if not hasattr(model, "_wire"):  # a tree from before agent.llm_wire: the SDK sent it
                    await sdk_post_unread(model, body)
                    return
                answer = await model._wire.open(body)
                async for _ in answer.chunks(lambda: RuntimeError("the model's stream broke off")):
                    pass
                await answer.aclose()

            async def store_trips() -> None:
                for _ in range(STORE_ROUND_TRIPS):
                    await store.client.eval("return 1", 0)

            async def message() -> None:
                await get_updates()
                await store_trips()
                await typing()
                await model_request()
                await send()

            rows: dict[str, Callable[[], Awaitable[None]]] = {
                "getUpdates, one message (python-telegram-bot)": get_updates,
                "sendChatAction (python-telegram-bot)": typing,
                "sendMessage, id read (python-telegram-bot)": send,
                "streamed model request, body unread (as LLMClient sends it)": model_request,
                f"{STORE_ROUND_TRIPS} store round trips (botd's client, embedded Valkey)": store_trips,
                "all of these, in a message's order": message,
            }
            samples: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
            try:
                for _ in range(args.rounds):
                    for name, call in rows.items():
                        for _ in range(args.warmup):
                            await call()
                        own, server = time.process_time(), proc_cpu(server_pid)
                        for _ in range(args.messages):
                            await call()
                        samples[name].append(((time.process_time() - own) * 1000 / args.messages,
                                              (proc_cpu(server_pid) - server) * 1000 / args.messages))
            finally:
                await bot.shutdown()
                await model.aclose()
                await store.close()
    results = {}
    for name, pairs in samples.items():
        own = statistics.median(p[0] for p in pairs)
        server = statistics.median(p[1] for p in pairs)
        results[name] = {"client_cpu_ms": round(own, 3), "store_cpu_ms": round(server, 3),
                         "total_cpu_ms": round(own + server, 3),
                         "rounds": [[round(a, 3), round(b, 3)] for a, b in pairs]}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300, help="calls per row and round")
    parser.add_argument("--warmup", type=int, default=20, help="calls before each timed run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    import uvloop  # botd's own event loop (bot.cli picks it when installed)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        results = runner.run(measure(args))
    print(table(["step", "client CPU ms", "store server CPU ms", "CPU ms per message"],
                [[name, r["client_cpu_ms"], r["store_cpu_ms"], r["total_cpu_ms"]] for name, r in results.items()]))
    parts = sum(r["total_cpu_ms"] for name, r in list(results.items())[:-1])
    print(f"sum of the steps: {parts:.2f} ms per message")
    write_json(args.output, {**report_header("floor", "bench/floor.py"), "args": {**vars(args), "output": str(args.output)},
                             "results": results, "sum_of_steps_ms": round(parts, 3)})


if __name__ == "__main__":
    main()
