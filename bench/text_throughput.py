"""Throughput of the pure text functions on 1 MB inputs, benign and hostile.

``agent.guard.scan`` runs on every inbound message and ``agent.sanitize.sanitize``
on every outbound one, so both must stay fast and, above all, linear on inputs
built to trigger regex backtracking. Each input is ``--chars`` characters (default
1,000,000); each function runs ``--repeat`` times per input and the median time is
reported as MB/s (millions of characters per second) next to the worst run.

    .venv/bin/python bench/text_throughput.py [--chars 1000000] [--repeat 5]

Prints a table and writes bench/text_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.guard import scan  # noqa: E402
from agent.sanitize import sanitize  # noqa: E402

OUTPUT = ROOT / "bench" / "text_throughput.json"

PROSE = (
    "The deploy went out at nine; error rates stayed flat and the p99 latency dropped a little. "
    "Next we should look at the cache hit ratio, which fell after Tuesday's config change.\n\n"
)
MARKDOWN = (
    "## Result\n\nHere is the fix:\n\n```python\nif user is None:\n    return []\n```\n\n"
    "- [x] tests pass\n- [ ] docs <b>updated</b> (see [the guide](https://example.com/a?b=c))\n\n"
)
MULTILINGUAL = "Grüße aus Köln! Το σύστημα λειτουργεί. 今日は晴れです。 Déjà vu ✅🚀\n"
REPLY_WITH_SCAFFOLDING = (
    "<think>The user wants the status; check the log first.</think>\n"
    '[Tool Call: read_file]\nArguments:\n{"path": "status.md"}\n'
    "<final>All services are up.</final>\n\n"
)

# name -> (kind, repeated unit)
INPUTS: dict[str, tuple[str, str]] = {
    "prose (ASCII)": ("benign", PROSE),
    "markdown + code": ("benign", MARKDOWN),
    "multilingual + emoji": ("benign", MULTILINGUAL),
    "reply with scaffolding": ("benign", REPLY_WITH_SCAFFOLDING),
    "'ignore all ' x N": ("hostile", "ignore all "),
    "'you are ' x N": ("hostile", "you are "),
    "whitespace": ("hostile", " \t\n"),
    "'<|im_start|' x N": ("hostile", "<|im_start|"),
    "'<think' x N": ("hostile", "<think"),
    "'<think>' x N (unclosed)": ("hostile", "<think>"),
    "'<think x=' x N (no '>')": ("hostile", "<think x="),
    "'<tool_call ' x N (no '>')": ("hostile", "<tool_call "),
    "'< / final ' x N": ("hostile", "< / final "),
    "'[Tool Call:' lines": ("hostile", "[Tool Call: x]\n{\n"),
    "'[System Message]' lines": ("hostile", "[System Message]\n"),
    "blank paragraphs": ("hostile", "a\n\n\n\n"),
}

FUNCTIONS: dict[str, Callable[[str], Any]] = {"guard.scan": scan, "sanitize": sanitize}


def build(unit: str, chars: int) -> str:
    return (unit * (chars // len(unit) + 1))[:chars]


def measure(fn: Callable[[str], Any], text: str, repeat: int) -> dict[str, float]:
    fn(text)  # warm-up (regex caches, allocator)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn(text)
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    return {
        "median_ms": round(median * 1000, 2),
        "max_ms": round(max(times) * 1000, 2),
        "mb_per_s": round(len(text) / median / 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chars", type=int, default=1_000_000, help="characters per input")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per function and input")
    args = parser.parse_args()
    if args.chars < 1 or args.repeat < 1:
        parser.error("--chars and --repeat must be positive")

    rows = []
    for name, (kind, unit) in INPUTS.items():
        text = build(unit, args.chars)
        row: dict[str, Any] = {"input": name, "kind": kind, "chars": len(text)}
        for fn_name, fn in FUNCTIONS.items():
            row[fn_name] = measure(fn, text, args.repeat)
        rows.append(row)

    header = f"{'input':<28} {'kind':<8} " + " ".join(f"{n + ' MB/s':>16} {'max ms':>8}" for n in FUNCTIONS)
    print(header)
    print("-" * len(header))
    for row in rows:
        cells = " ".join(f"{row[n]['mb_per_s']:>16.1f} {row[n]['max_ms']:>8.1f}" for n in FUNCTIONS)
        print(f"{row['input']:<28} {row['kind']:<8} {cells}")

    result = {
        "chars": args.chars,
        "repeat": args.repeat,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "results": rows,
    }
    OUTPUT.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {OUTPUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
