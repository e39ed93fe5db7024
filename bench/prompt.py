"""The system prompt of a run: CPU to build it, with and without the workspace's files.

Every run builds its system prompt (``bot.gateway.prompt.system_prompt``: the config's
facts, the tool list, the time, and the workspace files IDENTITY.md, SOUL.md, MEMORY.md
and USER.md, each read and fenced). Rows, CPU µs of this process per prompt, the median
of ``--rounds`` rounds of ``--prompts`` (rows alternate within each round):

* ``empty workspace`` — no files (what ``bench/paths.py`` measures by default);
* ``lived-in workspace`` — the files of ``--lived-in`` (12 KB), unchanged between runs;
* ``lived-in, MEMORY.md rewritten each run`` — the memory written before every prompt
  (as an agent that remembers something each turn does), so it is read again each time;
  ``(the rewrite alone)`` is the write's own share of that row.

    .venv/bin/python bench/prompt.py [--prompts 2000] [--rounds 5]

Prints a table and writes bench/prompt.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.tools.registry import ToolRegistry
from agent.types import RunRequest
from bench.common import (
    LIVED_IN_FILES,
    ROOT,
    cpu_per_call,
    lived_in,
    report_header,
    table,
    temp_workspace,
    write_json,
)
from bot.app import declared_tools, tool_settings
from bot.config import BotdConfig
from bot.gateway.prompt import system_prompt

OUTPUT = ROOT / "bench" / "prompt.json"


async def measure(prompts: int, rounds: int) -> dict[str, dict[str, Any]]:
    request = RunRequest(session_key="agent:main:telegram:dm:42", channel="telegram", chat_id="42",
                         user_id="42", user_name="Ada", text="hello")
    with temp_workspace("botd-prompt-") as tmp:
        empty, full = tmp / "empty", tmp / "lived-in"
        empty.mkdir()
        lived_in(full)
        await asyncio.sleep(2.1)  # a file changed within two seconds of its read is read again next time
        configs = {name: BotdConfig.model_validate({"agent": {"workspace": str(path)}})
                   for name, path in (("empty", empty), ("lived-in", full))}
        cfg = configs["empty"]
        tools = ToolRegistry(declared_tools(cfg, tool_settings(cfg)))  # the default tools, as botd declares them
        memory = (full / "MEMORY.md").read_text(encoding="utf-8")
        turn = itertools.count()

        def build(name: str) -> Callable[[], Awaitable[str]]:
            async def call() -> str:
                return system_prompt(configs[name], tools, request, configs[name].workspace, "gpt-4o-mini")
            return call

        async def rewrite() -> None:
            (full / "MEMORY.md").write_text(f"{memory[:-12]}{next(turn):012d}", encoding="utf-8")

        async def rewritten() -> str:
            await rewrite()
            return await build("lived-in")()

        rows: dict[str, Callable[[], Awaitable[Any]]] = {
            "empty workspace": build("empty"),
            "lived-in workspace": build("lived-in"),
            "lived-in, MEMORY.md rewritten each run": rewritten,
            "(the rewrite alone)": rewrite,
        }
        return await cpu_per_call(rows, calls=prompts, rounds=rounds, warmup=max(10, prompts // 20),
                                  key="cpu_us_per_prompt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    if min(args.prompts, args.rounds) < 1:
        parser.error("--prompts and --rounds must be >= 1")
    report = report_header("prompt", "bench/prompt.py")
    report["workspace_files"] = LIVED_IN_FILES
    report["results"] = asyncio.run(measure(args.prompts, args.rounds))
    print(table(["system prompt", "CPU µs per prompt (median)", "rounds"],
                [(name, r["cpu_us_per_prompt"], ", ".join(map(str, r["rounds"])))
                 for name, r in report["results"].items()]))
    write_json(args.output, report)


if __name__ == "__main__":
    main()
