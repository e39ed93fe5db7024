"""The agent loop (DESIGN.md §5): ask the model, run the tools it calls, repeat until it answers.

The loop is stateless over a message list: it gets the conversation so far and
returns only the messages the run added, so the caller decides how and where to
store them. Whatever happens — tool failures, model failures, cancellation — the
returned messages form a valid history: every assistant tool call has a result.
A failed model call adds nothing (its partial text was never an answer); an answer cut
at the output limit or filtered is kept, shown with a notice, and its calls never run.
``RunResult.error`` of a failed run is the text for the chat user (``agent.notices``);
the operator's detail goes to the log.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog

from agent import notices
from agent.budget import ContextFull, Preflight
from agent.llm_types import ChatModel, LLMError, LLMResponse, StreamDelta
from agent.tools.policy import authorize
from agent.tools.registry import ApprovalCallback, ToolContext, ToolError, ToolOutput, ToolRegistry
from agent.types import (
    AgentEvent,
    ChunkEvent,
    Message,
    ReasoningEvent,
    RunCancelledEvent,
    RunCompletedEvent,
    RunFailedEvent,
    RunResult,
    RunStartedEvent,
    RunStatus,
    ToolCall,
    ToolCallEvent,
    ToolResultEvent,
    Usage,
)

log = structlog.get_logger(__name__)

# Receives every AgentEvent of a run; may be sync or async. Exceptions are logged, not raised.
EventCallback = Callable[[AgentEvent], Awaitable[None] | None]
# Returns the user messages that arrived while the run was busy (DESIGN.md queue mode "steer").
SteerCallback = Callable[[], Awaitable[list[Message]]]

MAX_ITERATIONS_TEXT = "Stopped: maximum iteration limit reached."
SUMMARY_PROMPT = (
    "You have reached the maximum number of tool steps for this request, so tools are now disabled. "
    "Reply to the user with a short summary of what you did and found, and what is left to do."
)
CANCELLED_TOOL_RESULT = "cancelled"
# How long cancelled tools get to stop (kill their processes) before the run gives up on them.
TOOL_CANCEL_GRACE_S = 10.0
_MAX_EXCEPTION_TEXT = 200


class RunCancelled(asyncio.CancelledError):
    """The run was cancelled; ``result`` holds the valid messages it produced up to then.

    It is a ``CancelledError``, so cancellation keeps propagating unless the caller
    catches it explicitly (``except RunCancelled as e: save(e.result.messages)``).
    """

    def __init__(self, result: RunResult) -> None:
        super().__init__("run cancelled")
        self.result = result


async def run_loop(
    messages: Sequence[Message],
    *,
    model: ChatModel,
    tools: ToolRegistry,
    ctx: ToolContext,
    run_id: str,
    on_event: EventCallback | None = None,
    steer: SteerCallback | None = None,
    approve: ApprovalCallback | None = None,
    max_iterations: int = 20,
    preflight: Preflight | None = None,
) -> RunResult:
    """Run the agent over ``messages`` (not modified) and return what it added.

    With ``preflight``, every model call is checked against the context budget first
    (``agent.budget``); a request that cannot be made to fit ends the run as failed.
    Raises ``RunCancelled`` when the calling task is cancelled; never raises for tool
    or model failures (those end as ``is_error`` results or status ``failed``).
    """
    if max_iterations < 1:
        raise ValueError("max_iterations must be at least 1")
    run = _Run(messages, model, tools, ctx, run_id, on_event, steer, approve, preflight)
    return await run.run(max_iterations)


class _Run:
    """The state of one run, kept so cancellation can close it off validly at any await."""

    def __init__(
        self,
        messages: Sequence[Message],
        model: ChatModel,
        tools: ToolRegistry,
        ctx: ToolContext,
        run_id: str,
        on_event: EventCallback | None,
        steer: SteerCallback | None,
        approve: ApprovalCallback | None,
        preflight: Preflight | None = None,
    ) -> None:
        self.history: list[Message] = list(messages)
        self.preflight = preflight
        self.new: list[Message] = []
        self.model = model
        self.tools = tools
        self.ctx = ctx
        self.run_id = run_id
        self.on_event = on_event
        self.steer = steer
        self.approve = approve
        self.usage = Usage()
        self.iterations = 0
        # The finish reason that cut the final answer short ("length", "content_filter"), if any.
        self.cut_reason: str | None = None
        # While a model call streams: what has arrived so far (kept if the run is cancelled).
        self.streaming = False
        self.partial_text: list[str] = []
        self.partial_reasoning: list[str] = []
        # While tools run: the calls, their results as they finish, and their tasks.
        self.open_calls: list[ToolCall] = []
        self.results: list[Message | None] = []
        self.tool_tasks: list[asyncio.Task[None]] = []
        self.log = log.bind(run_id=run_id, session_key=ctx.session_key)

    async def run(self, max_iterations: int) -> RunResult:
        try:
            await self.emit(RunStartedEvent(run_id=self.run_id))
            result = await self._execute(max_iterations)
            summary = _summary(result)
            if self.cut_reason is not None:
                summary["finish_reason"] = self.cut_reason
            if result.status == "failed":
                await self.emit(RunFailedEvent(run_id=self.run_id, error=result.error, data=summary))
            else:
                await self.emit(RunCompletedEvent(run_id=self.run_id, text=result.text, data=summary))
            return result
        except asyncio.CancelledError:
            result = await self._close_cancelled()
            raise RunCancelled(result) from None

    async def _execute(self, max_iterations: int) -> RunResult:
        try:
            return await self._iterate(max_iterations)
        except LLMError as exc:
            # The failed call's partial text is not kept: it was never a whole answer.
            self.streaming = False
            self.log.warning("agent.llm_failed", kind=exc.kind, status=exc.status, started=exc.started, error=str(exc))
            return self._result("failed", error=notices.failure_notice(exc))
        except ContextFull:
            return self._result("failed", error=notices.CONTEXT_FULL)
        except Exception as exc:  # a bug somewhere below; the run fails, the process lives on
            self.streaming = False
            self.log.exception("agent.run_crashed", error_type=type(exc).__name__)
            self._close_open_calls(f"Error: the run failed ({type(exc).__name__}).")
            return self._result("failed", error=notices.INTERNAL_ERROR)

    async def _iterate(self, max_iterations: int) -> RunResult:
        schemas = self.tools.schemas() or None
        for _ in range(max_iterations):
            await self._take_steered()
            await self._fit(schemas)
            response = await self._call_model(self.history, schemas)
            if response.finish_reason in notices.CUT_NOTICES:
                return self._cut_short(response)
            self._append(
                Message(
                    role="assistant",
                    content=response.text if response.text or not response.tool_calls else None,
                    tool_calls=response.tool_calls or None,
                    reasoning=response.reasoning or None,
                )
            )
            if not response.tool_calls:
                return self._result("completed", text=response.text)
            await self._run_tools(response.tool_calls)
        return await self._summarize()

    def _cut_short(self, response: LLMResponse) -> RunResult:
        """An answer the model stopped early (output limit) or the provider filtered:
        what came is kept and shown with a notice; its tool calls, whose arguments may
        be cut, never run."""
        reason = response.finish_reason or ""
        notice = notices.CUT_NOTICES[reason]
        self.cut_reason = reason
        self.log.warning(
            "agent.answer_cut", finish_reason=reason, text_chars=len(response.text),
            dropped_tool_calls=len(response.tool_calls),
        )
        if response.text.strip():
            self._append(Message(role="assistant", content=response.text, reasoning=response.reasoning or None))
        text = f"{response.text.rstrip()}\n\n{notice}" if response.text.strip() else notice
        return self._result("completed", text=text)

    async def _summarize(self) -> RunResult:
        """At the cap: one last call without tools asking for a summary, else the fixed text."""
        self.log.info("agent.max_iterations", iterations=self.iterations)
        text = ""
        reasoning = ""
        try:
            await self._fit(None)
            response = await self._call_model([*self.history, Message.user(SUMMARY_PROMPT)], None)
            text, reasoning = response.text, response.reasoning
        except ContextFull:
            self.log.warning("agent.summary_skipped", reason="context_full")
        except LLMError as exc:
            self.streaming = False
            self.log.warning("agent.summary_failed", kind=exc.kind, error=str(exc))
        if not text.strip():
            text = MAX_ITERATIONS_TEXT
        self._append(Message(role="assistant", content=text, reasoning=reasoning or None))
        return self._result("max_iterations", text=text)

    # -- the model ------------------------------------------------------------------
    async def _take_steered(self) -> None:
        if self.steer is None:
            return
        try:
            steered = await self.steer()
        except Exception:
            self.log.exception("agent.steer_failed")
            return
        for message in steered:
            self._append(message)

    async def _fit(self, schemas: list[dict[str, Any]] | None) -> None:
        """The pre-flight budget check; the run's own messages stay as they are for the caller."""
        if self.preflight is not None:
            self.history = await self.preflight.fit(self.history, len(self.new), schemas, log_=self.log)

    async def _call_model(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> LLMResponse:
        self.partial_text.clear()
        self.partial_reasoning.clear()
        self.streaming = True
        self.iterations += 1
        response = await self.model.complete(messages, tools, self._on_delta)
        self.streaming = False
        self.usage = self.usage + response.usage
        if self.preflight is not None:
            self.preflight.measured(response.usage.prompt_tokens, len(messages), estimated=response.usage.estimated)
        return response

    async def _on_delta(self, delta: StreamDelta) -> None:
        if delta.kind == "text":
            self.partial_text.append(delta.text)
            await self.emit(ChunkEvent(run_id=self.run_id, text=delta.text))
        else:
            self.partial_reasoning.append(delta.text)
            await self.emit(ReasoningEvent(run_id=self.run_id, text=delta.text))

    # -- tools ----------------------------------------------------------------------
    async def _run_tools(self, calls: list[ToolCall]) -> None:
        """Run every call of one turn concurrently; append the results in call order."""
        results: list[Message | None] = [None] * len(calls)  # a late finisher writes to this list only
        self.open_calls = list(calls)
        self.results = results
        self.tool_tasks = [
            asyncio.create_task(self._run_tool(call, results, i), name=f"tool:{call.name}:{call.id}")
            for i, call in enumerate(calls)
        ]
        await asyncio.wait(self.tool_tasks)
        self.tool_tasks = []
        self._close_open_calls("Error: the tool call was cancelled.")

    async def _run_tool(self, call: ToolCall, results: list[Message | None], index: int) -> None:
        started = time.monotonic()
        await self.emit(ToolCallEvent(run_id=self.run_id, tool_call=call))
        output = await self._execute_tool(call)
        result = Message.tool(call.id, output.content, is_error=output.is_error)
        results[index] = result
        duration_ms = (time.monotonic() - started) * 1000
        error = output.content if output.is_error else None
        await self.emit(
            ToolResultEvent(run_id=self.run_id, tool_call=call, tool_result=result, duration_ms=duration_ms, error=error)
        )

    async def _execute_tool(self, call: ToolCall) -> ToolOutput:
        """Validate, authorize and run one call; every failure becomes an ``is_error`` output."""
        try:
            args = self.tools.parse_arguments(call.name, call.arguments)
            tool = self.tools.get(call.name)
            if tool is None:  # parse_arguments already rejects unknown tools
                raise ToolError(f"Error: unknown tool {call.name!r}.")
            denial = await authorize(tool, args, self.ctx.policy, self.approve)
            if denial is not None:
                return ToolOutput(denial, is_error=True)
            output = await tool.execute(args, self.ctx)
        except ToolError as exc:
            return ToolOutput(str(exc), is_error=True)
        except Exception as exc:
            self.log.exception("agent.tool_crashed", tool=call.name, error_type=type(exc).__name__)
            return ToolOutput(f"Error: tool {call.name!r} failed: {_describe(exc)}", is_error=True)
        if not isinstance(output, ToolOutput):
            self.log.error("agent.tool_bad_output", tool=call.name, output_type=type(output).__name__)
            return ToolOutput(f"Error: tool {call.name!r} returned no usable output.", is_error=True)
        return output

    def _close_open_calls(self, missing_text: str) -> list[tuple[ToolCall, Message]]:
        """Append a result for every open call, ``missing_text`` where none arrived; return those."""
        synthesized: list[tuple[ToolCall, Message]] = []
        for call, result in zip(self.open_calls, self.results, strict=True):
            if result is None:
                result = Message.tool(call.id, missing_text, is_error=True)
                synthesized.append((call, result))
            self._append(result)
        self.open_calls = []
        self.results = []
        return synthesized

    # -- cancellation ---------------------------------------------------------------
    async def _close_cancelled(self) -> RunResult:
        """Stop the tools, keep what is valid, give open calls a "cancelled" result."""
        tasks = [t for t in self.tool_tasks if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            try:
                _, pending = await asyncio.wait(tasks, timeout=TOOL_CANCEL_GRACE_S)
                if pending:
                    self.log.warning("agent.tools_slow_to_cancel", tools=[t.get_name() for t in pending])
            except asyncio.CancelledError:
                self.log.warning("agent.cancel_cleanup_interrupted")
        self.tool_tasks = []
        partial = "".join(self.partial_text) if self.streaming else ""
        if partial:
            reasoning = "".join(self.partial_reasoning) or None
            self._append(Message(role="assistant", content=partial, reasoning=reasoning))
        self.streaming = False
        cancelled = self._close_open_calls(CANCELLED_TOOL_RESULT)
        result = self._result("cancelled", text=partial)
        try:
            for call, message in cancelled:
                await self.emit(
                    ToolResultEvent(
                        run_id=self.run_id, tool_call=call, tool_result=message,
                        error=CANCELLED_TOOL_RESULT,
                    )
                )
            await self.emit(RunCancelledEvent(run_id=self.run_id, text=partial, data=_summary(result)))
        except asyncio.CancelledError:
            self.log.warning("agent.cancel_events_interrupted")
        self.log.info("agent.run_cancelled", iterations=self.iterations, messages=len(self.new))
        return result

    # -- helpers --------------------------------------------------------------------
    def _append(self, message: Message) -> None:
        self.history.append(message)
        self.new.append(message)

    def _result(self, status: RunStatus, *, text: str = "", error: str | None = None) -> RunResult:
        return RunResult(
            text=text, messages=list(self.new), usage=self.usage, status=status, error=error, iterations=self.iterations
        )

    async def emit(self, event: AgentEvent) -> None:
        """Hand an event to the callback; its failures are logged and never end the run."""
        if self.on_event is None:
            return
        try:
            outcome = self.on_event(event)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:
            self.log.exception("agent.event_callback_failed", event_type=event.type)


def _summary(result: RunResult) -> dict[str, Any]:
    return {
        "status": result.status,
        "iterations": result.iterations,
        "prompt_tokens": result.usage.prompt_tokens,
        "completion_tokens": result.usage.completion_tokens,
        "usage_estimated": result.usage.estimated,
    }


def _describe(exc: BaseException) -> str:
    """``Type: first line of the message``, short; never a traceback."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    if len(text) > _MAX_EXCEPTION_TEXT:
        text = text[:_MAX_EXCEPTION_TEXT] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
