"""Prometheus metrics, all named ``botd_*``, on a registry of their own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)

RUNS = Counter("botd_runs_total", "Runs finished, by status and kind.", ["status", "kind"], registry=REGISTRY)
RUN_SECONDS = Histogram(
    "botd_run_duration_seconds", "Run latency from start to delivery.", ["kind"], registry=REGISTRY,
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
LLM_SECONDS = Histogram(
    "botd_llm_call_duration_seconds", "One LLM call.", ["model", "outcome"], registry=REGISTRY,
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
LLM_PROBLEMS = Counter(
    "botd_llm_problems_total",
    "LLM calls that failed for good (by LLMError kind) or were cut short (length, content_filter).",
    ["kind"], registry=REGISTRY,
)
TOKENS = Counter("botd_llm_tokens_total", "Tokens used, by direction.", ["direction"], registry=REGISTRY)
TOOL_CALLS = Counter("botd_tool_calls_total", "Tool calls, by tool and outcome.", ["tool", "outcome"], registry=REGISTRY)
QUEUE_DEPTH = Gauge("botd_queue_depth", "Messages waiting in inboxes this replica enqueued or drained.", registry=REGISTRY)
ACTIVE_RUNS = Gauge("botd_active_runs", "Runs in progress on this replica.", registry=REGISTRY)
DELIVERIES = Counter("botd_deliveries_total", "Reply parts, by channel and outcome.", ["channel", "outcome"], registry=REGISTRY)
DEDUPE_HITS = Counter("botd_dedupe_hits_total", "Inbound duplicates dropped.", ["channel"], registry=REGISTRY)
GUARD_DETECTIONS = Counter(
    "botd_guard_detections_total", "Input guard detections, by pattern.", ["pattern"], registry=REGISTRY
)
INBOX_DROPS = Counter("botd_inbox_dropped_total", "Messages dropped because an inbox was full.", registry=REGISTRY)
COMMANDS = Counter("botd_commands_total", "Control commands handled.", ["command"], registry=REGISTRY)
LOOP_LAG = Gauge("botd_event_loop_lag_seconds", "Latest measured event-loop lag.", registry=REGISTRY)
SANDBOX_ACTIVE = Gauge("botd_tool_sandbox_active", "1 when tool processes run under bubblewrap.", registry=REGISTRY)
REDIS_UP = Gauge("botd_redis_up", "1 when Redis answered the last readiness check.", registry=REGISTRY)


def render() -> bytes:
    return generate_latest(REGISTRY)


def active_runs() -> int:
    """The ``botd_active_runs`` gauge's value, read from the gauge alone (collecting the
    whole registry to find one sample walks every histogram bucket)."""
    return int(sum(sample.value for metric in ACTIVE_RUNS.collect() for sample in metric.samples))


def runs_finished() -> float:
    """How many runs this replica finished so far, every status and kind together."""
    return sum(sample.value for metric in RUNS.collect() for sample in metric.samples if sample.name.endswith("_total"))
