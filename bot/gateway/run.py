"""Running one batch of a session's messages: the path of DESIGN.md §2 from "load
history" to "append the run's messages".

``RunExecutor.execute`` goes through named steps: resume a result a previous attempt
saved, prepare the model's input (guard, history, system prompt), run the agent loop
with a ``RunObserver`` watching its events, and finish (store and record, deliver).

Persisting order makes retries safe: the model's result is stored, and the run recorded
in the session, in the round trip that claims the first part, before anything is sent;
delivery is claimed per part, and the session append is idempotent per run, so a
replica dying anywhere in here leads to a retry that neither asks the model twice
(once the result is stored) nor sends a part twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from agent import notices
from agent.budget import Preflight
from agent.guard import apply_guard
from agent.images import drop_old_images
from agent.llm_types import ChatModel
from agent.loop import RunCancelled, run_loop
from agent.tasks import uncancel_current
from agent.tools.registry import ToolContext, ToolRegistry, ToolSettings
from agent.types import (
    Message,
    RunRequest,
    RunResult,
)
from bot import metrics
from bot.config import BotdConfig
from bot.gateway.attachments import Attachments
from bot.gateway.context import RunContext, baseline_for
from bot.gateway.observer import RunObserver
from bot.gateway.prompt import system_prompt
from bot.gateway.reply import DeliveryLedger, Reply, notify
from bot.gateway.run_control import RETRY_REASONS, OutcomeStatus, RunControl, RunOutcome
from bot.models import ModelCatalog, ModelProfile
from bot.store.owned import RideAlong
from bot.store.sessions import SessionStore
from bot.tracing import Trace, TraceStore, TracingModel, clip, verbose
from bot.workspaces import SessionWorkspaces
from channels.base import ChannelAdapter, Target

if TYPE_CHECKING:
    from redis.asyncio.client import Pipeline

    from bot.compactor import SessionCompactor
    from bot.gateway.approvals import Approvals
    from bot.gateway.redelivery import Redelivery

log = structlog.get_logger(__name__)

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
    compactor: SessionCompactor | None = None
    redelivery: Redelivery | None = None
    workspaces: SessionWorkspaces | None = None  # None: every run uses tool_settings as is
    tool_extra: dict[str, Any] = field(default_factory=dict)
    models: ModelCatalog | None = None  # None: only ``model``, with the llm section's limits

    @property
    def catalog(self) -> ModelCatalog:
        if self.models is None:
            self.models = ModelCatalog(self.cfg, self.model)
        return self.models


@dataclass
class _Turn:
    """One execution's facts, handed from step to step."""

    batch: list[RunRequest]
    channel: ChannelAdapter
    target: Target
    trace: Trace
    reply: Reply
    bound: Any
    context: RunContext | None = None
    settings: ToolSettings | None = None  # the tool settings of the session's directory, once known
    recorded: tuple[int, int] | None = None  # stored messages and compactions, once the run is recorded

    @property
    def profile(self) -> ModelProfile | None:
        return self.context.profile if self.context is not None else None

    @property
    def first(self) -> RunRequest:
        return self.batch[0]

    @property
    def last(self) -> RunRequest:
        return self.batch[-1]

    @property
    def run_id(self) -> str:
        return self.batch[0].run_id

    @property
    def session_key(self) -> str:
        return self.batch[0].session_key


class RunExecutor:
    def __init__(self, deps: RunDeps) -> None:
        self.deps = deps
        # Files go to the inbox of the directory the session's tools work in.
        self.attachments = Attachments(deps.cfg, deps.ledger, lambda req: self._settings(req).workspace)

    async def execute(self, batch: list[RunRequest], control: RunControl) -> RunOutcome:
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
        reply = Reply(
            channel, target, run_id, self.deps.ledger,
            kind=first.kind, previews=first.kind == "chat", redelivery=self.deps.redelivery,
            resumed=control.resumed,
        )
        turn = _Turn(batch, channel, target, trace, reply, bound)
        started = time.monotonic()
        metrics.ACTIVE_RUNS.inc()
        try:
            outcome = await self._execute(turn, control)
        finally:
            metrics.ACTIVE_RUNS.dec()
        outcome.also = reply.deferred_mark
        metrics.RUNS.labels(outcome.status, first.kind).inc()
        metrics.RUN_SECONDS.labels(first.kind).observe(time.monotonic() - started)
        trace.status, trace.error, trace.finished_at = outcome.status, outcome.error, time.time()
        try:
            await self.deps.traces.save(trace)
        except Exception as exc:
            bound.warning("trace.save_failed", error=str(exc))
        bound.info("run.finished", status=outcome.status, delivery=outcome.delivery, kind=first.kind)
        return outcome

    async def _execute(self, turn: _Turn, control: RunControl) -> RunOutcome:
        # Only an earlier attempt at this batch can have stored its result.
        saved = await self.deps.ledger.load_result(turn.run_id) if control.resumed else None
        if saved is not None:
            control.output_started()
            return await self._resume_saved(turn, saved)
        fresh = turn.first.meta.get("fresh_session") == "1"
        if fresh:
            await self.deps.sessions.reset(turn.session_key)
        loaded = None if fresh else control.start_context()  # read with the batch's claim, when it was
        user_messages = await self._guarded(turn.batch, turn.channel, turn.target)
        if not user_messages:
            return RunOutcome(turn.run_id, "blocked", "none", "blocked by the input guard")
        if loaded is None:
            # One read for the run's start: history, summary, the session's model and usage,
            # and the first steer's stop check and take (the run is registered by now, so a
            # stop after this read cancels it directly).
            loaded, ahead = await self.deps.sessions.context_with(turn.session_key, control.queue_steer)
            control.steer_ahead(ahead)
        profile = self.deps.catalog.profile(loaded.model) or self.deps.catalog.default
        turn.context = RunContext(
            self.deps.sessions, self.deps.compactor, turn.session_key, profile, self.deps.cfg.agent.history_turns,
            settings=self._turn_settings(turn), loaded=loaded,
        )
        messages = await self._prepare(turn, user_messages, turn.context)
        model = TracingModel(self.deps.catalog.client(profile.id), turn.trace, profile.id)
        try:
            result = await self._run_agent(turn, control, messages, model)
        except RunCancelled as cancelled:
            return await self._cancelled(turn, control, user_messages, cancelled.result, model)
        try:
            control.output_started()
        except asyncio.CancelledError:  # cancelled after the model's last word, before any of it was shown
            return await self._cancelled(turn, control, user_messages, result, model)
        return await self._finish(turn, user_messages, result, model)

    async def _resume_saved(self, turn: _Turn, saved: RunResult) -> RunOutcome:
        """A previous attempt got the answer but died before recording it: finish its work."""
        turn.bound.info("run.resume_saved_result")
        delivery = await turn.reply.finish(saved.text)
        await self.deps.sessions.append(turn.session_key, turn.run_id, saved.messages)
        return RunOutcome(turn.run_id, _status(saved), delivery, saved.error, saved.text)

    async def _prepare(self, turn: _Turn, user_messages: list[Message], context: RunContext) -> list[Message]:
        """The model's input: system prompt, the prepared history, the new user messages."""
        if verbose():
            turn.trace.input = clip("\n\n".join(m.content or "" for m in user_messages))
        await self.attachments.sweep(turn.last)
        workspace = self._turn_settings(turn).workspace
        system = system_prompt(self.deps.cfg, self.deps.tools, turn.last, workspace, context.profile.id)
        first, *rest = await context.request(user_messages, Message.system(system))
        # Images cost the most context: the oldest go first (their text stays), all of them
        # when the model is not a vision model.
        image_budget = context.profile.context_window // 4 if self.deps.cfg.llm.vision else 0
        return [first, *drop_old_images(rest, image_budget)]

    async def _run_agent(
        self, turn: _Turn, control: RunControl, messages: list[Message], model: TracingModel
    ) -> RunResult:
        deps, last = self.deps, turn.last

        async def approve(tool: str, args: dict[str, Any]) -> bool:
            async def ask(approval_id: str, summary: str) -> None:
                await turn.channel.ask_approval(turn.target, approval_id, summary)

            return await deps.approvals.request(
                session_key=turn.session_key, chat_id=turn.target.chat_id, run_id=turn.run_id,
                user_id=last.user_id, tool=tool, args=args, ask=ask,
            )

        async def steer_messages() -> list[Message]:
            return await self._guarded(await control.steer(), turn.channel, turn.target)

        async def send_file(path: Path, caption: str | None) -> str:
            return await self.attachments.send_once(turn.channel, turn.target, turn.run_id, path, caption)

        ctx = ToolContext(
            run_id=turn.run_id,
            session_key=turn.session_key,
            settings=self._turn_settings(turn),
            policy=last.tool_policy,
            chat={"channel": last.channel, "chat_id": last.chat_id, "thread_id": last.thread_id,
                  "user_id": last.user_id},
            extra={**deps.tool_extra, "user_id": last.user_id, "user_name": last.user_name},
            send_file=send_file,
        )
        preflight = None
        if turn.context is not None:
            usage = turn.context.usage or await deps.sessions.usage(turn.session_key)
            preflight = Preflight(
                turn.context.budget,
                compact=turn.context.compact if deps.compactor is not None else None,
                baseline=baseline_for(usage, messages, len(turn.context.user_messages)),
            )
        await turn.reply.start()
        return await run_loop(
            messages,
            model=model,
            tools=deps.tools,
            ctx=ctx,
            run_id=turn.run_id,
            on_event=RunObserver(turn.reply, turn.trace, control),
            steer=steer_messages,
            approve=approve,
            max_iterations=deps.cfg.agent.max_iterations,
            preflight=preflight,
        )

    async def _cancelled(
        self, turn: _Turn, control: RunControl, user_messages: list[Message], partial: RunResult, model: TracingModel
    ) -> RunOutcome:
        uncancel_current()
        reason = control.acknowledge() or "cancelled"
        await asyncio.shield(turn.reply.abandon())
        if reason not in RETRY_REASONS:
            # Stopped by the user or timed out: what happened so far stays in history.
            # Otherwise the batch is retried whole, so nothing is recorded now.
            await asyncio.shield(
                self._persist(turn, user_messages, partial, model)
            )
        if reason == "timeout" and turn.first.kind == "chat":
            # A /stop is answered by its command; a timeout would otherwise end in silence.
            await asyncio.shield(
                notify(turn.channel, turn.target, self.deps.ledger, turn.run_id, "timeout", notices.TIMEOUT)
            )
        status: OutcomeStatus = "timeout" if reason == "timeout" else "cancelled"
        return RunOutcome(turn.run_id, status, "none", reason)

    async def _finish(
        self, turn: _Turn, user_messages: list[Message], result: RunResult, model: TracingModel
    ) -> RunOutcome:
        deps, run_id, session_key = self.deps, turn.run_id, turn.session_key
        if result.status == "failed":
            # The chat gets the user's words; the outcome and trace keep the operator's detail.
            detail = model.failure_detail or result.error
            turn.bound.warning("run.llm_failed", error=detail)
            await turn.reply.abandon()
            await notify(turn.channel, turn.target, deps.ledger, run_id, "error", result.error or notices.INTERNAL_ERROR)
            await self._persist(turn, user_messages, result, model)
            return RunOutcome(run_id, "failed", "none", detail)

        notice = ""
        if turn.first.kind == "chat" and turn.context is not None and model.usages:
            notice = await turn.context.warning_notice(model.usages[-1])
        text = result.text + notice
        saved = result.model_copy(update={"messages": user_messages + result.messages, "text": text})
        # The run is recorded in the round trip that saves its result and claims the first
        # part, before the send; only when nothing is saved is it recorded on its own.
        delivery = await turn.reply.finish(text, saved, also=self._recording(turn, user_messages, result, model))
        stored = turn.recorded or await self._persist(turn, user_messages, result, model)
        if deps.compactor is not None:
            try:
                await deps.compactor.maybe_compact(
                    session_key, model.last_prompt_tokens, turn.profile,
                    settings=self._turn_settings(turn), stored=stored,
                )
            except Exception as exc:
                turn.bound.warning("compaction.failed", error=str(exc))
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
            if not req.attachments:
                out.append(Message.user(outcome.text))
                continue
            files = await self.attachments.prepare(req, channel, target)
            text = "\n".join([outcome.text, *files.lines]) if outcome.text else "\n".join(files.lines)
            out.append(Message(role="user", content=text, images=files.images or None))
        return out

    async def _persist(
        self, turn: _Turn, user_messages: list[Message], result: RunResult, model: TracingModel
    ) -> tuple[int, int]:
        """Append the run and its usage (one record per LLM call, so "last prompt" is the
        last call's, not the run's sum) and its cost; the stored message and compaction counts after."""
        return await self.deps.sessions.record_run(**self._record(turn, user_messages, result, model))

    def _recording(self, turn: _Turn, user_messages: list[Message], result: RunResult, model: TracingModel) -> RideAlong:
        """:meth:`_persist` riding along another step's round trip; its counts land in ``turn.recorded``."""
        def queue(pipe: Pipeline) -> Callable[[list[Any]], None]:
            counts = self.deps.sessions.queue_record_run(pipe, **self._record(turn, user_messages, result, model))

            def read(replies: list[Any]) -> None:
                turn.recorded = counts(replies)
            return read
        return queue

    def _record(self, turn: _Turn, user_messages: list[Message], result: RunResult, model: TracingModel) -> dict[str, Any]:
        profile, context = turn.profile, turn.context
        return {
            "session_key": turn.session_key, "run_id": turn.run_id, "messages": user_messages + result.messages,
            "usages": [(u.prompt_tokens, u.completion_tokens) for u in model.usages],
            "price": profile.cost if profile is not None else None,
            "rearm_warning": context is not None and context.rearm_warning,
        }

    def _turn_settings(self, turn: _Turn) -> ToolSettings:  # _settings of the last message, once
        if turn.settings is None:
            turn.settings = self._settings(turn.last)
        return turn.settings

    def _settings(self, req: RunRequest) -> ToolSettings:
        """The tool settings of ``req``'s session directory (``agent.workspace_scope``)."""
        workspaces = self.deps.workspaces
        return workspaces.settings_for(req) if workspaces else self.deps.tool_settings


def _status(result: RunResult) -> OutcomeStatus:
    return "max_iterations" if result.status == "max_iterations" else "completed"

