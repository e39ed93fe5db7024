"""A ChatModel wrapper that records each LLM call as a trace span and in metrics."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from agent import notices
from agent.llm_types import ChatModel as ChatModelProto
from agent.llm_types import DeltaCallback, LLMError, LLMResponse
from agent.types import Message, Usage
from bot import metrics
from bot.tracing import Trace, clip, verbose


class TracingModel:
    def __init__(self, inner: ChatModelProto, trace: Trace, model_name: str) -> None:
        self._inner = inner
        self._trace = trace
        self._model = model_name
        self.usages: list[Usage] = []
        # The operator's detail of the last failed call ("kind: message"), for the outcome.
        self.failure_detail: str | None = None

    @property
    def last_prompt_tokens(self) -> int:
        return self.usages[-1].prompt_tokens if self.usages else 0

    async def complete(
        self, messages: Sequence[Message], tools: list[dict[str, Any]] | None, on_delta: DeltaCallback | None = None
    ) -> LLMResponse:
        start = time.time()
        extra: dict[str, Any] = {}
        if verbose():
            extra["input"] = clip("\n".join(f"{m.role}: {m.content or ''}" for m in messages))
        try:
            response = await self._inner.complete(messages, tools, on_delta)
        except LLMError as exc:
            self.failure_detail = f"{exc.kind}: {exc}"
            self._trace.span("llm", self._model, start, error=self.failure_detail, tools=bool(tools), **extra)
            metrics.LLM_SECONDS.labels(self._model, "error").observe(time.time() - start)
            metrics.LLM_PROBLEMS.labels(exc.kind).inc()
            raise
        usage = response.usage
        self.usages.append(usage)
        if verbose():
            extra["output"] = clip(response.text)
        self._trace.span(
            "llm", self._model, start,
            prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
            estimated=usage.estimated, tool_calls=len(response.tool_calls), attempts=response.attempts,
            tools=bool(tools), finish_reason=response.finish_reason, **extra,
        )
        if response.finish_reason in notices.CUT_NOTICES:
            metrics.LLM_PROBLEMS.labels(response.finish_reason).inc()
        metrics.LLM_SECONDS.labels(self._model, "ok").observe(time.time() - start)
        metrics.TOKENS.labels("prompt").inc(usage.prompt_tokens)
        metrics.TOKENS.labels("completion").inc(usage.completion_tokens)
        return response
