"""Cost of the agent's built-in tools: the bash blocklist, subprocess calls, file tools.

* the command guard on typical command lines (µs per check) and on 128 KiB hostile
  lines built to make a parser or a regex go quadratic (worst time per check);
* a ``bash`` call end to end (guard, allowlisted env, ``bash -c`` in its own process
  group, capture, clean-up) and a YAML CLI tool call (no shell), in ms per call, outside
  and inside the tool sandbox (bubblewrap + limits), and the sandbox's overhead;
* ``read_file`` of a 1 MiB file and an atomic ``write_file`` of 1 MiB;
* ``/stop``-style cancellation: from ``task.cancel()`` on a running ``bash`` call
  (a tree of sleeping children) until every process of the tree is gone;
* MCP: a tool call to a stdio server (the fake MCPServer in ``tests/fakes``) next to a
  CLI tool call, and a server's start-up (spawn, handshake, first tool list).

    .venv/bin/python bench/tools.py [--calls 200] [--checks 2000]

Prints a table and writes bench/tools.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.tools.bash import BashTool  # noqa: E402
from agent.tools.cli_tools import load_cli_tools  # noqa: E402
from agent.tools.command_guard import BlockedCommandError, check_command  # noqa: E402
from agent.tools.files import ReadFileTool, WriteFileTool  # noqa: E402
from agent.tools.mcp import McpManager  # noqa: E402
from agent.tools.registry import ToolContext, ToolRegistry, ToolSettings  # noqa: E402
from agent.tools.sandbox import Sandbox  # noqa: E402
from tests.fakes.mcp_rig import ALLOWLIST, stdio_spec  # noqa: E402

OUTPUT = ROOT / "bench" / "tools.json"


def summary_ms(seconds: list[float]) -> dict[str, float]:
    """p50/p99/max in milliseconds (nearest rank) of samples given in seconds."""
    ms = sorted(s * 1000 for s in seconds)

    def rank(q: float) -> float:
        return round(ms[min(len(ms), max(1, math.ceil(q / 100 * len(ms)))) - 1], 3)

    return {"n": len(ms), "p50_ms": rank(50), "p99_ms": rank(99), "max_ms": round(ms[-1], 3)}


def table(headers: list[str], rows: list[list[Any]]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = [headers, ["-" * w for w in widths], *rows]
    return "\n".join(
        "  ".join(
            str(v).ljust(w) if i == 0 else str(v).rjust(w)
            for i, (v, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in lines
    )


TYPICAL = [
    "ls -la",
    "git status && git diff --stat | tail -5",
    'find . -name "*.py" -exec grep -l TODO {} +',
    "python3 -c 'import json,sys; print(json.load(sys.stdin))' < data.json",
    'for f in *.log; do echo "$f: $(wc -l < "$f")"; done',
    "curl -s https://example.com/api | jq '.items[] | .name'",
    "cat <<EOF > notes.md\n# Notes\n$(date)\nEOF",
    "bash -c 'cd src && make -j2 2>&1 | tail -20'",
]
LIMIT = 131_000
HOSTILE = {
    "one long word": "a" * LIMIT,
    "'; ls' x N": "; ls" * (LIMIT // 4),
    "'ls | ' x N": "ls | " * (LIMIT // 5) + "ls",
    "nested ( x N": "(" * (LIMIT // 2) + ")" * (LIMIT // 2),
    "$( x N": "$(" * (LIMIT // 4) + ")" * (LIMIT // 4),
    "xargs + 999 words": "xargs " + "chmod " * 999,
    "whitespace": "echo" + " " * LIMIT,
    "function defs": "f(){ g; };" * (LIMIT // 10),
    "here-docs": "cat <<E\n" * (LIMIT // 8),
    "brace, commas": "{" + "," * LIMIT,
    "brackets": "[" * LIMIT,
    "case patterns": "case x in " + "a|" * (LIMIT // 2) + "esac",
    "interpreter code": "python3 -c '" + "rm " * (LIMIT // 3 - 10) + "'",
}


def guard_figures(checks: int) -> tuple[list[list[Any]], dict[str, Any]]:
    samples: list[float] = []
    for i in range(checks):
        command = TYPICAL[i % len(TYPICAL)]
        started = time.perf_counter()
        check_command(command)
        samples.append(time.perf_counter() - started)
    typical = summary_ms(samples)
    rows = [
        ["guard: typical line", f"{typical['p50_ms'] * 1000:.0f} µs", f"{typical['p99_ms'] * 1000:.0f} µs"]
    ]
    worst: dict[str, float] = {}
    for name, command in HOSTILE.items():
        started = time.perf_counter()
        with contextlib.suppress(BlockedCommandError):
            check_command(command)
        worst[name] = round((time.perf_counter() - started) * 1000, 1)
    slowest = max(worst, key=lambda k: worst[k])
    rows.append([f"guard: 128 KiB hostile, worst ({slowest})", f"{worst[slowest]:.0f} ms", "–"])
    return rows, {"typical": typical, "hostile_ms": worst}


async def call_figures(calls: int, workspace: Path) -> tuple[list[list[Any]], dict[str, Any]]:
    tools_file = workspace / "tools.yaml"
    tools_file.write_text(
        "tools:\n  - name: say\n    category: read\n    cmd: printf\n"
        "    args: ['%s', '{{text}}']\n    parameters: {text: {type: string}}\n"
    )
    (say,) = load_cli_tools(tools_file)
    results: dict[str, Any] = {}
    rows: list[list[Any]] = []
    sandbox = Sandbox.from_mode("auto")
    variants = [("no sandbox", Sandbox(bwrap=None, reason="bench"))]
    if sandbox.active:
        variants.append(("bwrap", sandbox))
        if sandbox.pids_cgroup is not None:  # as root: moving into a cgroup v1 costs extra
            variants.append(("bwrap, no pids cgroup", dataclasses.replace(sandbox, pids_cgroup=None)))
    else:
        print(f"sandbox unavailable, only unsandboxed figures: {sandbox.reason}", file=sys.stderr)
    for variant, box in variants:
        settings = ToolSettings(workspace=workspace, allowed_paths=(workspace,), timeout_s=30, sandbox=box)
        ctx = ToolContext(run_id="bench", session_key="bench", settings=settings)
        bash = BashTool(settings)
        for label, run in [
            (f"bash: `true` ({variant})", lambda b=bash, c=ctx: b.execute({"command": "true"}, c)),
            (f"bash: `echo hi | wc -c` ({variant})",
             lambda b=bash, c=ctx: b.execute({"command": "echo hi | wc -c"}, c)),
            (f"CLI tool: printf, no shell ({variant})", lambda c=ctx: say.execute({"text": "hi"}, c)),
        ]:
            for _ in range(5):  # warm-up: page cache, first namespace set-up
                await run()
            await timed(label, run, calls, results, rows)
    for variant, _ in variants[1:]:
        for what in ("bash: `true`", "CLI tool: printf, no shell"):
            inside, outside = results[f"{what} ({variant})"], results[f"{what} (no sandbox)"]
            overhead = {k: round(inside[k] - outside[k], 3) for k in ("p50_ms", "p99_ms")}
            label = f"overhead of {variant}: {what}"
            results[label] = overhead
            rows.append([label, f"{overhead['p50_ms']:.2f} ms", f"{overhead['p99_ms']:.2f} ms"])

    big = workspace / "big.txt"
    big.write_text(("x" * 99 + "\n") * 10_486)  # ~1 MiB of 100-byte lines
    read_ctx = ToolContext(run_id="b", session_key="b", settings=ToolSettings(workspace=workspace))
    for label, run in [
        ("read_file: 1 MiB", lambda: ReadFileTool().execute({"path": "big.txt"}, read_ctx)),
        (
            "write_file: 1 MiB (atomic, fsync)",
            lambda: WriteFileTool().execute({"path": "copy.txt", "content": "y" * 1_048_576}, read_ctx),
        ),
    ]:
        await timed(label, run, max(10, calls // 10), results, rows)
    return rows, results


async def timed(
    label: str, run: Any, calls: int, results: dict[str, Any], rows: list[list[Any]]
) -> None:
    """Time ``calls`` successful calls of ``run``; add their summary to ``results`` and ``rows``."""
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        out = await run()
        samples.append(time.perf_counter() - started)
        assert not out.is_error, out.content
    stats = summary_ms(samples)
    results[label] = stats
    rows.append([label, f"{stats['p50_ms']:.2f} ms", f"{stats['p99_ms']:.2f} ms"])


async def cancel_figures(rounds: int, workspace: Path) -> tuple[list[list[Any]], dict[str, Any]]:
    settings = ToolSettings(workspace=workspace, timeout_s=120)
    ctx = ToolContext(run_id="bench", session_key="bench", settings=settings)
    bash = BashTool(settings)
    command = "echo $$ > pids; sleep 60 & echo $! >> pids; (sleep 60 & echo $! >> pids; wait) & wait"
    samples = []
    pid_file = workspace / "pids"
    for _ in range(rounds):
        pid_file.unlink(missing_ok=True)
        task = asyncio.create_task(bash.execute({"command": command}, ctx))
        while not (pid_file.exists() and len(pid_file.read_text().split()) == 3):
            await asyncio.sleep(0.005)
        pids = [int(p) for p in pid_file.read_text().split()]
        started = time.perf_counter()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        while any(_alive(p) for p in pids):
            await asyncio.sleep(0.001)
        samples.append(time.perf_counter() - started)
    stats = summary_ms(samples)
    return [
        ["cancel bash call -> tree gone", f"{stats['p50_ms']:.2f} ms", f"{stats['p99_ms']:.2f} ms"]
    ], stats


async def _mcp_ready(workspace: Path) -> McpManager:
    markers = workspace / "mcp-markers"
    markers.mkdir(exist_ok=True)
    manager = McpManager([stdio_spec("bench", markers)], ToolRegistry(), cwd=workspace, env_allowlist=ALLOWLIST)
    await manager.start()
    connection = manager.connections["bench"]
    while connection.state != "ready":
        if connection.last_error:
            raise RuntimeError(f"the MCP server did not start: {connection.last_error}")
        await asyncio.sleep(0.002)
    return manager


async def mcp_startup_figures(starts: int, workspace: Path) -> tuple[list[list[Any]], dict[str, Any]]:
    """From ``McpManager.start()`` until the stdio server's tools are registered."""
    samples = []
    for _ in range(starts):
        started = time.perf_counter()
        manager = await _mcp_ready(workspace)
        samples.append(time.perf_counter() - started)
        await manager.stop()
    stats = summary_ms(samples)
    return [["MCP stdio server start-up (spawn, handshake, list)", f"{stats['p50_ms']:.0f} ms",
             f"{stats['p99_ms']:.0f} ms"]], stats


async def mcp_call_figures(calls: int, workspace: Path) -> tuple[list[list[Any]], dict[str, Any]]:
    """An MCP stdio tool call and a CLI tool call, interleaved so both see the same machine load."""
    ctx = ToolContext(run_id="bench", session_key="bench", settings=ToolSettings(workspace=workspace))
    tools_file = workspace / "mcp-cli.yaml"
    tools_file.write_text(
        "tools:\n  - name: say\n    category: read\n    cmd: printf\n"
        "    args: ['%s', '{{text}}']\n    parameters: {text: {type: string}}\n"
    )
    (say,) = load_cli_tools(tools_file)
    manager = await _mcp_ready(workspace)
    echo = manager.registry.get("bench__echo")
    assert echo is not None
    samples: dict[str, list[float]] = {"MCP stdio call: echo": [], "CLI tool call: printf": []}
    try:
        for _ in range(calls):
            for label, tool in (("MCP stdio call: echo", echo), ("CLI tool call: printf", say)):
                started = time.perf_counter()
                out = await tool.execute({"text": "hi"}, ctx)
                samples[label].append(time.perf_counter() - started)
                assert not out.is_error, out.content
    finally:
        await manager.stop()
    results = {label: summary_ms(values) for label, values in samples.items()}
    rows = [[label, f"{s['p50_ms']:.2f} ms", f"{s['p99_ms']:.2f} ms"] for label, s in results.items()]
    return rows, results


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="subprocess calls per row")
    parser.add_argument("--checks", type=int, default=2000, help="guard checks of typical lines")
    args = parser.parse_args()
    if shutil.which("bash") is None:
        raise SystemExit("bash is required")
    workspace = Path(tempfile.mkdtemp(prefix="botd-bench-tools-", dir="/tmp"))
    try:
        guard_rows, guard = guard_figures(args.checks)
        call_rows, calls = await call_figures(args.calls, workspace)
        cancel_rows, cancel = await cancel_figures(max(5, args.calls // 10), workspace)
        mcp_rows, mcp_calls = await mcp_call_figures(args.calls, workspace)
        start_rows, mcp_start = await mcp_startup_figures(max(5, args.calls // 20), workspace)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    print(table(["what", "p50", "p99"], [*guard_rows, *call_rows, *cancel_rows, *mcp_rows, *start_rows]))
    report = {
        "benchmark": "tools",
        "command": " ".join([".venv/bin/python", "bench/tools.py", *sys.argv[1:]]),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "guard": guard,
        "calls": calls,
        "cancel": cancel,
        "mcp": {"calls": mcp_calls, "startup": mcp_start},
    }
    OUTPUT.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")


if __name__ == "__main__":
    asyncio.run(main())
