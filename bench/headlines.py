"""One line per benchmark (or one per sub-case) for the README's summary table, read from
each benchmark's JSON output; ``run_all`` writes them. A benchmark without a summarizer
here gets its first few p50 figures."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


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


def _prompt(r: dict[str, Any]) -> str:
    return "; ".join(f"{name} {_fmt(row['cpu_us_per_prompt'], 0)} µs" for name, row in r["results"].items())


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
    "prompt": _prompt,
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
