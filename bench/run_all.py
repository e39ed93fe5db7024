"""Run every benchmark in bench/, collect their JSON into bench/results.json and
regenerate the summary table in bench/README.md.

Each script runs as a subprocess (one after another, so they do not compete for the
CPU) with its defaults, or with small sizes under ``--quick``; its own JSON output
(``bench/<name>.json``) is read back afterwards. Scripts left out with ``--only`` or
``--skip`` are not run, but their last JSON output is still collected (marked so). The summary is written between the
``<!-- run_all:begin -->`` and ``<!-- run_all:end -->`` markers of bench/README.md
(added before the first section when missing), one line per benchmark from
``bench/headlines.py``; the rest of the file is left alone.

    .venv/bin/python bench/run_all.py [--quick] [--only gateway,store_ops] [--skip slack]
        [--timeout 1800] [--no-readme]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import machine, write_json  # noqa: E402
from bench.headlines import headlines  # noqa: E402

BENCH = ROOT / "bench"
README = BENCH / "README.md"
RESULTS = BENCH / "results.json"
BEGIN, END = "<!-- run_all:begin -->", "<!-- run_all:end -->"

# Known scripts, in the order they run; any other bench/*.py runs after them. A module
# without a ``__main__`` block (the parts a script imports) is not a benchmark.
ORDER = ("loop_overhead", "text_throughput", "store_ops", "gateway", "telegram", "slack", "paths")
NOT_BENCHMARKS = {"common", "run_all", "__init__"}
QUICK_ARGS: dict[str, list[str]] = {
    "loop_overhead": ["--turns", "100", "--warmup", "10"],
    "text_throughput": ["--chars", "200000", "--repeat", "3"],
    "store_ops": ["--ops", "500", "--sessions", "100"],
    "gateway": ["--quick"],
    "slack": ["--events", "100", "--burst", "50", "--replies", "50"],
    "attachments": ["--samples", "5"],
    "paths": ["--quick"],
    "floor": ["--messages", "100", "--rounds", "1"],
    "prompt": ["--prompts", "200", "--rounds", "1"],
}


def discover() -> list[Path]:
    scripts = {p.stem: p for p in BENCH.glob("*.py")
               if p.stem not in NOT_BENCHMARKS and not p.stem.startswith("_") and _runnable(p)}
    ordered = [scripts.pop(name) for name in ORDER if name in scripts]
    return ordered + [scripts[name] for name in sorted(scripts)]


def _runnable(path: Path) -> bool:
    return 'if __name__ == "__main__":' in path.read_text()


def quick_args(script: Path) -> list[str]:
    """Small sizes for ``--quick``: known ones from the table, else the script's own
    ``--quick`` when its ``--help`` mentions one, else its defaults."""
    if script.stem in QUICK_ARGS:
        return QUICK_ARGS[script.stem]
    try:
        help_text = subprocess.run(
            [sys.executable, str(script), "--help"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60
        ).stdout
    except subprocess.TimeoutExpired:
        return []
    return ["--quick"] if "--quick" in help_text else []


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_one(script: Path, args: list[str], timeout_s: float, log_dir: Path) -> dict[str, Any]:
    output = BENCH / f"{script.stem}.json"
    before = output.stat().st_mtime if output.exists() else None
    log_path = log_dir / f"{script.stem}.log"
    command = [".venv/bin/python", f"bench/{script.name}", *args]
    print(f"== {' '.join(command)}", flush=True)
    started = time.monotonic()
    status = "ok"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(script), *args], cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT
        )
        try:
            returncode = proc.wait(timeout=timeout_s)
            if returncode != 0:
                status = f"failed (exit {returncode})"
        except subprocess.TimeoutExpired:
            status = f"timeout ({timeout_s:g} s)"
            # SIGTERM first, so a script can stop the servers it started.
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    seconds = round(time.monotonic() - started, 1)
    entry: dict[str, Any] = {"command": " ".join(command), "status": status, "seconds": seconds,
                             "log": str(log_path)}
    fresh = output.exists() and (before is None or output.stat().st_mtime > before)
    if fresh:
        try:
            entry["output"] = str(output.relative_to(ROOT))
            entry["result"] = json.loads(output.read_text())
        except (OSError, ValueError) as exc:
            entry["status"] = f"unreadable output ({exc})" if status == "ok" else status
    elif status == "ok":
        entry["status"] = "no output"
    print(f"   {entry['status']} in {seconds} s (log: {log_path})", flush=True)
    if entry["status"] != "ok":
        print("   " + "\n   ".join(log_path.read_text().splitlines()[-15:]), flush=True)
    return entry


def collect_earlier(script: Path) -> dict[str, Any] | None:
    """A benchmark left out this time (``--only``/``--skip``): its last JSON output, if any."""
    output = BENCH / f"{script.stem}.json"
    try:
        data = json.loads(output.read_text())
    except (OSError, ValueError):
        return None
    when = data.get("timestamp") if isinstance(data, dict) else None
    when = when or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(output.stat().st_mtime))
    command = data.get("command") if isinstance(data, dict) else None
    return {"command": command or f".venv/bin/python bench/{script.name}", "status": f"not run; output of {when}",
            "seconds": None, "output": str(output.relative_to(ROOT)), "result": data}


def summary_markdown(results: dict[str, Any]) -> str:
    lines = [
        BEGIN,
        "## Summary (`bench/run_all.py`)",
        "",
        f"Generated by `{results['command']}` at {results['timestamp']} "
        f"({results['machine']['cpus']} CPUs, Python {results['machine']['python']}); "
        "all outputs together: `bench/results.json`. The sections below explain each benchmark.",
        "",
        "| benchmark | command | status | wall s | headline |",
        "|---|---|---|---:|---|",
    ]
    for name, entry in results["benchmarks"].items():
        seconds = "–" if entry["seconds"] is None else entry["seconds"]
        for label, text in headlines(name, entry.get("result")):
            lines.append(f"| {label} | `{entry['command']}` | {entry['status']} | {seconds} | {text} |")
    lines.append(END)
    return "\n".join(lines)


def update_readme(block: str, path: Path = README) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text and text.index(BEGIN) < text.index(END):
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + block + tail
    else:
        # Before the first section, after the introduction.
        at = text.find("\n## ")
        if at < 0:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
        else:
            text = text[: at + 1] + block + "\n\n" + text[at + 1 :]
    path.write_text(text)
    print(f"updated {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes for every script")
    parser.add_argument("--only", type=lambda s: s.split(","), default=None, help="names to run, comma-separated")
    parser.add_argument("--skip", type=lambda s: s.split(","), default=[], help="names to leave out")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per script")
    parser.add_argument("--no-readme", action="store_true", help="do not touch bench/README.md")
    args = parser.parse_args()

    scripts = [s for s in discover() if (args.only is None or s.stem in args.only) and s.stem not in args.skip]
    if args.only:
        missing = set(args.only) - {s.stem for s in discover()}
        if missing:
            parser.error(f"no such benchmark: {', '.join(sorted(missing))}")
    results: dict[str, Any] = {
        "command": " ".join([".venv/bin/python", "bench/run_all.py", *sys.argv[1:]]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "quick": args.quick,
        "benchmarks": {},
    }
    log_dir = Path(tempfile.mkdtemp(prefix="botd-run-all-"))
    for script in discover():
        if script in scripts:
            extra = quick_args(script) if args.quick else []
            results["benchmarks"][script.stem] = run_one(script, extra, args.timeout, log_dir)
        else:
            earlier = collect_earlier(script)
            if earlier is not None:
                results["benchmarks"][script.stem] = earlier
    write_json(RESULTS, results)

    rows = [(label, e["status"], e["seconds"], text)
            for name, e in results["benchmarks"].items() for label, text in headlines(name, e.get("result"))]
    print()
    for name, status, seconds, text in rows:
        print(f"{name:<16} {status:<12} {'–' if seconds is None else seconds:>7} s  {text}")
    if not args.no_readme:
        update_readme(summary_markdown(results))
    if any(e["status"] != "ok" for name, e in results["benchmarks"].items() if name in {p.stem for p in scripts}):
        sys.exit(1)


if __name__ == "__main__":
    main()
