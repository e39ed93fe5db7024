"""What a run shows and records while the agent works: its events become live previews
in the chat, a trace span and a metric per tool call.

Kept apart from ``run.py`` because it reacts to the loop's event stream, while the run
module orders the steps around it; ``control.output_started()`` is called before anything
is shown, so a cancelled run never shows more than it will record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.types import AgentEvent, ChunkEvent, ToolCallEvent, ToolResultEvent
from bot import metrics
from bot.gateway.reply import Reply
from bot.tracing import Trace

if TYPE_CHECKING:
    from bot.gateway.run_control import RunControl


class RunObserver:
    """Watches the loop's events: previews for text, a trace span and a metric per tool."""

    def __init__(self, reply: Reply, trace: Trace, control: RunControl) -> None:
        self._reply = reply
        self._trace = trace
        self._control = control

    async def __call__(self, event: AgentEvent) -> None:
        if isinstance(event, ChunkEvent):
            self._control.output_started()
            await self._reply.on_chunk(event.text)
        elif isinstance(event, ToolCallEvent):
            self._control.output_started()
            self._reply.reset_text()
            await self._reply.on_tool(event.tool_call.name)
        elif isinstance(event, ToolResultEvent):
            failed = event.tool_result.is_error
            await self._reply.on_tool(event.tool_call.name, done=True, ok=not failed, ms=event.duration_ms or 0.0)
            metrics.TOOL_CALLS.labels(event.tool_call.name, "error" if failed else "ok").inc()
            self._trace.tool_span(event)
