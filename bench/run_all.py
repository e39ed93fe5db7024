"""Run every benchmark in bench/, collect their JSON into bench/results.json and
regenerate the summary table in bench/README.md.

Each script runs as a subprocess (one after another, so they do not compete for the
CPU) with its defaults, or with small sizes under ``--quick``; its own JSON output
(``bench/<name>.json``) is read back afterwards. Scripts left out with ``--only`` or
``--skip`` are not run, but their last JSON output is still collected (marked so). The summary is written between the
``<!-- run_all:begin -->`` and ``<!-- run_all:end -->`` markers of bench/README.md
(added before the first section when missing); the rest of the file is left alone.

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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import machine, write_json  # noqa: E402

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


# ---- one line per benchmark for the README summary ------------------------------------


def _fmt(value: Any, digits: int = 2) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def _loop_overhead(r: dict[str, Any]) -> str:
    return "; ".join(
        f"{row['tool_calls_per_turn']} tools: loop p50 {_fmt(row['loop_own_ms_p50'], 3)} ms, "
        f"turn p50 {_fmt(row['turn_ms_p50'])} ms"
        for row in r["results"]
    )


def _text_throughput(r: dict[str, Any]) -> str:
    rows = r["results"]
    scan = min(rows, key=lambda x: x["guard.scan"]["mb_per_s"])
    san = min(rows, key=lambda x: x["sanitize"]["mb_per_s"])
    return (
        f"slowest scan {scan['guard.scan']['mb_per_s']} MB/s (`{scan['input']}`); "
        f"slowest sanitize {san['sanitize']['mb_per_s']} MB/s (`{san['input']}`)"
    )


def _store_ops(r: dict[str, Any]) -> str:
    ops = {row["operation"]: row for row in r["results"]}
    parts = [f"{name} p50 {_fmt(row['p50_ms'], 3)} ms" for name, row in ops.items()
             if name.startswith(("append (4", "history", "lock"))]
    if "memory" in r:
        parts.append(f"{r['memory']['bytes_per_session']} B/session in Redis")
    return "; ".join(parts)


def _llm_request(r: dict[str, Any]) -> str:
    rows = r["results"]
    botd = rows["LLMClient.complete"]["us_per_request"]
    return "; ".join(f"{name} {_fmt(row['us_per_request'], 0)} µs ({_fmt(botd / row['us_per_request'], 2)}×)"
                     for name, row in rows.items())


def _store_client(r: dict[str, Any]) -> str:
    rows = r["results"]
    own, theirs = "botd's client", "redis-py's path"
    ops = dict.fromkeys(name.split(", ")[0] for name in rows)
    return "; ".join(f"{op} {_fmt(rows[op + ', ' + own]['us_per_call'], 0)} µs "
                     f"({theirs} {_fmt(rows[op + ', ' + theirs]['us_per_call'], 0)})" for op in ops)


def _floor(r: dict[str, Any]) -> str:
    *steps, (_, whole) = r["results"].items()
    return (f"a message's library calls alone {_fmt(whole['total_cpu_ms'])} ms of CPU (steps apart "
            f"{_fmt(r['sum_of_steps_ms'])} ms: " + ", ".join(f"{name} {_fmt(row['total_cpu_ms'])}" for name, row in steps)
            + ")")


def _gateway(r: dict[str, Any]) -> str:
    parts = []
    if "overhead" in r:
        o = r["overhead"]
        parts.append(f"own overhead p50/p99 {_fmt(o['own']['p50_ms'])}/{_fmt(o['own']['p99_ms'])} ms "
                     f"(e2e at 0 ms LLM {_fmt(o['e2e']['p50_ms'])}/{_fmt(o['e2e']['p99_ms'])} ms)")
    for c in r.get("concurrency", []):
        ratio = f", {c['vs_ideal']}× ideal" if c.get("vs_ideal") else ""
        parts.append(f"{c['sessions']}×{c['messages_per_session']} at {c['latency_ms']:g} ms: "
                     f"{c['seconds']} s{ratio}, {c['messages_per_s']} msg/s")
    if "stop" in r:
        s = r["stop"]
        parts.append(f"/stop notice p50/p99 {_fmt(s['to_notice']['p50_ms'])}/{_fmt(s['to_notice']['p99_ms'])} ms")
    if "memory" in r:
        m = r["memory"]
        parts.append(f"RSS {m['rss_before_mib']}→{m['rss_after_mib']} MiB over {m['sessions']} sessions, "
                     f"{m['redis_bytes_per_session']} B/session in Redis")
    return "; ".join(parts)


def _slack(r: dict[str, Any]) -> str:
    return (
        f"Socket Mode event p50 {r['socket_mode']['p50_ms']} ms; HTTP event p50 {r['http_events']['p50_ms']} ms; "
        f"reply cycle p50 {r['outbound']['reply_cycle']['p50_ms']} ms"
    )


def _replicas(r: dict[str, Any]) -> str:
    return "; ".join(
        f"{row['replicas']} replica(s), {row['sessions']}×{row['messages_per_session']} at {row['latency_ms']:g} ms: "
        f"{row['seconds']} s, {row['vs_ideal']}× ideal, {row['messages_per_s']} msg/s, "
        f"p50/p99 {row['latency']['p50_s']}/{row['latency']['p99_s']} s"
        f"{'' if row['exactly_once'] else ', NOT exactly once'}"
        for row in r["results"]
    )


def _paths_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """One row per path: the whole daemon measured from outside (bench/paths.py)."""
    out = []
    for name, p in r["paths"].items():
        if "error" in p and not set(p) - {"path", "error"}:
            out.append((name, f"failed: {p['error'][:200]}"))
            continue
        parts = []
        if "sequential" in p:
            s = p["sequential"]
            lone = s["lone"]["total"]
            parts.append(f"CPU {_fmt(s['cpu_ms_per_message_p50'])} ms/msg p50, "
                         f"{_fmt(s['store_commands_per_message'], 1)} store cmds "
                         f"({_fmt(s['store_round_trips_per_message'], 1)} round trips)/msg, "
                         f"lone p50/p99 {_fmt(lone['p50_ms'], 1)}/{_fmt(lone['p99_ms'], 1)} ms")
        for b in p.get("burst", []):
            parts.append(f"{b['chats']} at {b['latency_ms']:g} ms: all in {b['all_answered_s']} s")
        if "load" in p:
            lo = p["load"]
            parts.append(f"{lo['sessions']}×{lo['messages_per_session']} at {lo['latency_ms']:g} ms: "
                         f"{lo['seconds']} s = {lo['vs_ideal']}× ideal")
        if "idle" in p:
            parts.append(f"idle {_fmt(p['idle']['cpu_ms_per_s_exact'])} ms/s")
        if "tree_rss_mib" in p:
            parts.append(f"RSS {p['tree_rss_mib']} MiB")
        if after := (p.get("memory") or {}).get("after"):
            parts.append(f"RSS after {p['memory']['sessions']} sessions: {after['botd_rss_mib']} + "
                         f"{after['store_rss_mib']} (store) = {after['tree_rss_mib']} MiB")
        out.append((name, "; ".join(parts)))
    return out


# Benchmarks whose summary is one row per sub-case (label, headline).
ROW_SUMMARIZERS: dict[str, Callable[[dict[str, Any]], list[tuple[str, str]]]] = {
    "paths": _paths_rows,
}


SUMMARIZERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "loop_overhead": _loop_overhead,
    "text_throughput": _text_throughput,
    "store_ops": _store_ops,
    "llm_request": _llm_request,
    "store_client": _store_client,
    "floor": _floor,
    "gateway": _gateway,
    "slack": _slack,
    "replicas": _replicas,
}


def _leaves(data: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _leaves(value, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for i, value in enumerate(data[:3]):
            yield from _leaves(value, f"{path}[{i}]")
    else:
        yield path, data


def _generic(r: dict[str, Any]) -> str:
    """Unknown shape: the first few p50 figures it reports."""
    found = [f"{path.removesuffix('.p50_ms').removesuffix('_p50_ms')} p50 {_fmt(v)} ms"
             for path, v in _leaves(r) if path.endswith("p50_ms") and isinstance(v, int | float)]
    return "; ".join(found[:4]) or "see its JSON"


def headline(name: str, result: dict[str, Any] | None) -> str:
    if result is None:
        return "–"
    try:
        text = SUMMARIZERS.get(name, _generic)(result)
    except (KeyError, TypeError, ValueError, IndexError):
        text = _generic(result)
    return text.replace("|", "/")


def headlines(name: str, result: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(row label, headline) for the summary: one row, or one per sub-case."""
    if result is not None and name in ROW_SUMMARIZERS:
        try:
            return [(f"{name}: {label}", text.replace("|", "/")) for label, text in ROW_SUMMARIZERS[name](result)]
        except (KeyError, TypeError, ValueError, IndexError):
            pass
    return [(name, headline(name, result))]


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
