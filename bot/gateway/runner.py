"""Executing one batch of a session's messages: the path of DESIGN.md §2 from
"load history" to "append the run's messages".

Persisting order makes retries safe: the model's result is stored before delivery,
delivery is claimed per part, and the session append is idempotent per run, so a
replica dying anywhere in here leads to a retry that neither asks the model twice
(once the result is stored) nor sends a part twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol
from zoneinfo import ZoneInfo

import structlog

from agent.guard import apply_guard
from agent.history import prepare_history
from agent.llm_types import ChatModel
from agent.loop import RunCancelled, run_loop
from agent.prompt import PromptSpec, build_system_prompt
from agent.tools.registry import ToolContext, ToolRegistry, ToolSettings
from agent.types import AgentEvent, Message, RunRequest, RunResult
from bot import metrics
from bot.config import BotdConfig
from bot.gateway.approvals import Approvals
from bot.gateway.delivery import DeliveryLedger
from bot.gateway.reply import DeliveryStatus, Reply, notify
from bot.gateway.tracing_model import TracingModel
from bot.store.sessions import SessionStore
from bot.tracing import Trace, TraceStore, clip, verbose
from bot.workspaces import SessionWorkspaces
from channels.base import ChannelAdapter, Target

log = structlog.get_logger(__name__)

OutcomeStatus = Literal["completed", "failed", "cancelled", "timeout", "max_iterations", "blocked"]
SteerFn = Callable[[], Awaitable[list[RunRequest]]]

# Cancellations after which the batch is run again elsewhere rather than recorded.
RETRY_REASONS = frozenset({"shutdown", "lock_lost"})

TIMEOUT_TEXT = "Sorry — this took too long and was stopped. Please try again, perhaps with a smaller request."
LLM_FAILURE_TEXT = "Sorry — I couldn't get an answer from the model ({reason}). Please try again in a moment."


class Compactor(Protocol):
    async def maybe_compact(
        self, session_key: str, last_prompt_tokens: int, *, settings: ToolSettings | None = None
    ) -> bool: ...


@dataclass
class RunOutcome:
    run_id: str
    status: OutcomeStatus
    delivery: DeliveryStatus | Literal["none"] = "none"
    error: str | None = None
    text: str = ""


@dataclass
class RunDeps:
    cfg: BotdConfig
    sessions: SessionStore
    model: ChatModel
    tools: ToolRegistry
    tool_settings: ToolSettings
    channels: Mapping[str, ChannelAdapter]
    ledger: DeliveryLedger
    approvals: Approvals
    traces: TraceStore
    compactor: Compactor | None = None
    workspaces: SessionWorkspaces | None = None  # None: every run uses tool_settings as is
    tool_extra: dict[str, Any] = field(default_factory=dict)


class RunExecutor:
    def __init__(self, deps: RunDeps) -> None:
        self.deps = deps

    async def execute(
        self, batch: list[RunRequest], *, steer: SteerFn, cancel_reason: Callable[[], str | None]
    ) -> RunOutcome:
        """Run ``batch`` (oldest first) as one turn; never raises for run-level failures."""
        first, last = batch[0], batch[-1]
        run_id, session_key = first.run_id, first.session_key
        bound = log.bind(run_id=run_id, session_key=session_key)
        channel = self.deps.channels.get(last.channel)
        if channel is None:
            bound.error("run.no_channel", channel=last.channel)
            return RunOutcome(run_id, "failed", "failed", f"channel {last.channel!r} is not enabled")
        target = Target.of(last)
        trace = Trace(run_id=run_id, session_key=session_key, kind=first.kind, channel=last.channel)
        started = time.monotonic()
        metrics.ACTIVE_RUNS.inc()
        try:
            outcome = await self._execute(batch, channel, target, trace, steer, cancel_reason, bound)
        finally:
            metrics.ACTIVE_RUNS.dec()
        metrics.RUNS.labels(outcome.status, first.kind).inc()
        metrics.RUN_SECONDS.labels(first.kind).observe(time.monotonic() - started)
        trace.status, trace.error, trace.finished_at = outcome.status, outcome.error, time.time()
        try:
            await self.deps.traces.save(trace)
        except Exception as exc:
            bound.warning("trace.save_failed", error=str(exc))
        bound.info("run.finished", status=outcome.status, delivery=outcome.delivery, kind=first.kind)
        return outcome

    async def _execute(
        self,
        batch: list[RunRequest],
        channel: ChannelAdapter,
        target: Target,
        trace: Trace,
        steer: SteerFn,
        cancel_reason: Callable[[], str | None],
        bound: Any,
    ) -> RunOutcome:
        deps, first, last = self.deps, batch[0], batch[-1]
        run_id, session_key, kind = first.run_id, first.session_key, first.kind
        reply = Reply(channel, target, run_id, deps.ledger, kind=kind, previews=kind == "chat")

        saved = await deps.ledger.load_result(run_id)
        if saved is not None:
            # A previous attempt got the answer but died before recording it: finish its work.
            bound.info("run.resume_saved_result")
            delivery = await reply.finish(saved.text)
            await deps.sessions.append(session_key, run_id, saved.messages)
            return RunOutcome(run_id, _status(saved), delivery, saved.error, saved.text)

        if first.meta.get("fresh_session") == "1":
            await deps.sessions.reset(session_key)

        user_messages = await self._guarded(batch, channel, target)
        if not user_messages:
            return RunOutcome(run_id, "blocked", "none", "blocked by the input guard")
        if verbose():
            trace.input = clip("\n\n".join(m.content or "" for m in user_messages))

        history = await deps.sessions.history(session_key)
        summary = await deps.sessions.summary(session_key)
        prepared = prepare_history(
            history,
            history_turns=deps.cfg.agent.history_turns,
            context_window_tokens=deps.cfg.llm.context_window,
            summary=summary,
        )
        settings = deps.workspaces.settings_for(last) if deps.workspaces else deps.tool_settings
        system = build_system_prompt(self._prompt_spec(last, settings.workspace))
        messages = [Message.system(system), *prepared, *user_messages]

        async def on_event(event: AgentEvent) -> None:
            if event.type == "chunk":
                await reply.on_chunk(event.text)
            elif event.type == "tool.call":
                reply.reset_text()
            elif event.type == "tool.result" and event.tool_call is not None:
                result = event.tool_result
                failed = bool(result and result.is_error)
                metrics.TOOL_CALLS.labels(event.tool_call.name, "error" if failed else "ok").inc()
                attrs: dict[str, Any] = {}
                if verbose():
                    attrs = {"input": clip(event.tool_call.arguments), "output": clip(result.content or "" if result else "")}
                trace.spans.append(
                    _tool_span(event, failed, attrs)
                )

        async def approve(tool: str, args: dict[str, Any]) -> bool:
            async def ask(approval_id: str, summary: str) -> None:
                await channel.ask_approval(target, approval_id, summary)

            return await deps.approvals.request(
                session_key=session_key, chat_id=target.chat_id, run_id=run_id,
                user_id=last.user_id, tool=tool, args=args, ask=ask,
            )

        async def steer_messages() -> list[Message]:
            return await self._guarded(await steer(), channel, target)

        ctx = ToolContext(
            run_id=run_id,
            session_key=session_key,
            settings=settings,
            policy=last.tool_policy,
            chat={"channel": last.channel, "chat_id": last.chat_id, "thread_id": last.thread_id,
                  "user_id": last.user_id},
            extra={**deps.tool_extra, "user_id": last.user_id, "user_name": last.user_name},
        )
        await reply.start()
        model = TracingModel(deps.model, trace, deps.cfg.llm.model)
        status: OutcomeStatus
        try:
            result = await run_loop(
                messages,
                model=model,
                tools=deps.tools,
                ctx=ctx,
                run_id=run_id,
                on_event=on_event,
                steer=steer_messages,
                approve=approve,
                max_iterations=deps.cfg.agent.max_iterations,
            )
        except RunCancelled as cancelled:
            _uncancel()
            reason = cancel_reason() or "cancelled"
            await asyncio.shield(reply.abandon())
            if reason not in RETRY_REASONS:
                # Stopped by the user or timed out: what happened so far stays in history.
                # Otherwise the batch is retried whole, so nothing is recorded now.
                await asyncio.shield(self._persist(session_key, run_id, user_messages, cancelled.result, model))
            if reason == "timeout" and kind == "chat":
                # A /stop is answered by its command; a timeout would otherwise end in silence.
                await asyncio.shield(notify(channel, target, deps.ledger, run_id, "timeout", TIMEOUT_TEXT))
            status = "timeout" if reason == "timeout" else "cancelled"
            return RunOutcome(run_id, status, "none", reason)

        if result.status == "failed":
            bound.warning("run.llm_failed", error=result.error)
            await reply.abandon()
            await notify(channel, target, deps.ledger, run_id, "error",
                         LLM_FAILURE_TEXT.format(reason=result.error or "unknown error"))
            await self._persist(session_key, run_id, user_messages, result, model)
            return RunOutcome(run_id, "failed", "none", result.error)

        await deps.ledger.save_result(run_id, result.model_copy(update={"messages": user_messages + result.messages}))
        delivery = await reply.finish(result.text)
        await self._persist(session_key, run_id, user_messages, result, model)
        if deps.compactor is not None:
            try:
                await deps.compactor.maybe_compact(session_key, model.last_prompt_tokens, settings=settings)
            except Exception as exc:
                bound.warning("compaction.failed", error=str(exc))
        return RunOutcome(run_id, _status(result), delivery, result.error, result.text)

    async def _guarded(self, batch: list[RunRequest], channel: ChannelAdapter, target: Target) -> list[Message]:
        """Apply the input guard to each message; blocked ones are answered and left out."""
        cfg = self.deps.cfg
        out: list[Message] = []
        for req in batch:
            outcome = apply_guard(req.text, action=cfg.guard.action, max_chars=cfg.agent.max_message_chars, log=log)
            for name in outcome.detected:
                metrics.GUARD_DETECTIONS.labels(name).inc()
            if outcome.blocked:
                await notify(channel, target, self.deps.ledger, req.run_id, "blocked", outcome.reason or "Blocked.")
                continue
            out.append(Message.user(outcome.text))
        return out

    async def _persist(
        self, session_key: str, run_id: str, user_messages: list[Message], result: RunResult, model: TracingModel
    ) -> None:
        await self.deps.sessions.append(session_key, run_id, user_messages + result.messages)
        # One record per LLM call, so "last prompt" is the last call's, not the run's sum.
        for index, usage in enumerate(model.usages):
            await self.deps.sessions.record_usage(
                session_key, usage.prompt_tokens, usage.completion_tokens, run_id=f"{run_id}:{index}"
            )

    def _prompt_spec(self, req: RunRequest, session_workspace: Path) -> PromptSpec:
        cfg = self.deps.cfg
        tz_name = cfg.heartbeat.timezone if req.kind == "heartbeat" else cfg.scheduler.timezone
        tools = self.deps.tools
        return PromptSpec(
            mode=req.prompt_mode,
            workspace=cfg.workspace,
            tools={name: (tool.description if (tool := tools.get(name)) else "") for name in tools.names()},
            user_name=req.user_name,
            user_id=req.user_id,
            channel=req.channel,
            now=datetime.now(UTC).astimezone(ZoneInfo(tz_name)),
            timezone=tz_name,
            agent_id=cfg.agent.id,
            model=cfg.llm.model,
            task=req.meta.get("task"),
            session_workspace=session_workspace,
        )


def _status(result: RunResult) -> OutcomeStatus:
    return "max_iterations" if result.status == "max_iterations" else "completed"


def _tool_span(event: AgentEvent, failed: bool, attrs: dict[str, Any]) -> Any:
    from bot.tracing import Span

    assert event.tool_call is not None
    ms = event.duration_ms or 0.0
    return Span(
        kind="tool", name=event.tool_call.name, start=time.time() - ms / 1000, ms=round(ms, 2),
        error=(event.tool_result.content or "")[:200] if failed and event.tool_result else None, attrs=attrs,
    )


def _uncancel() -> None:
    task = asyncio.current_task()
    while task is not None and task.cancelling():
        task.uncancel()
