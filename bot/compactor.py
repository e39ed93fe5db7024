"""Session compaction in the daemon: when to compact a stored session, and storing it safely.

The gateway calls :meth:`SessionCompactor.maybe_compact` after each run. Compaction
takes minutes at worst (a flush of up to 90 s, a summary of up to 120 s), so it is
guarded by its own short-lived Redis lock rather than relying on the caller, and
its result is stored with a compare-and-replace on the history's length and
version: if anything was appended meanwhile the replace is refused and those
messages are never lost. Every failure leaves the session exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from agent.compaction import CompactionError, compact, should_compact
from agent.llm_types import ChatModel, LLMError
from agent.tokens import estimate_tokens
from agent.tools.files import ReadFileTool, WriteFileTool
from agent.tools.registry import ToolContext, ToolRegistry, ToolSettings
from agent.types import ToolPolicy, new_id
from bot.config import BotdConfig
from bot.store.keys import Keys
from bot.store.locks import Lease
from bot.store.sessions import SessionStore

log = structlog.get_logger(__name__)

# Longer than the flush (90 s) and the summary (120 s) together, with room for the store.
LOCK_TTL_S: Final[float] = 300.0
EXPECTED_FAILURES: Final = (LLMError, CompactionError, RedisError, OSError)


def compaction_lock_key(keys: Keys, session_key: str) -> str:
    """``<prefix>:compaction:<session_key>``: held while one compaction of the session runs."""
    return keys.compaction(session_key)


class SessionCompactor:
    """Compacts stored sessions that outgrew the trigger (DESIGN.md §5 "Compaction")."""

    def __init__(
        self,
        sessions: SessionStore,
        client: aioredis.Redis,
        keys: Keys | str,
        model: ChatModel,
        tool_settings: ToolSettings,
        cfg: BotdConfig,
        *,
        tools: ToolRegistry | None = None,
        lock_ttl_s: float = LOCK_TTL_S,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        if lock_ttl_s < 240:
            raise ValueError(f"the compaction lock TTL must be at least 240 s, got {lock_ttl_s!r}")
        self.sessions = sessions
        self.client = client
        self.keys = keys if isinstance(keys, Keys) else Keys(keys)
        self.model = model
        self.tool_settings = tool_settings
        self.cfg = cfg
        # The flush only ever gets read_file/write_file; these defaults are the built-in ones.
        self.tools = tools if tools is not None else ToolRegistry([ReadFileTool(), WriteFileTool()])
        self.lock_ttl_s = lock_ttl_s
        self.clock = clock or (lambda: datetime.now(UTC))

    async def maybe_compact(
        self, session_key: str, last_prompt_tokens: int, *,
        settings: ToolSettings | None = None, stored: tuple[int, int] | None = None
    ) -> bool:
        """Compact ``session_key`` if it is due; True only when a compaction was stored.

        ``stored``: the session's message and compaction counts when the caller has just
        read them (saves reading them again). Never raises for a failed compaction (it is
        logged and the history stays untouched); cancellation propagates.
        """
        bound = log.bind(session_key=session_key)
        try:
            due, compactions = await self._due(session_key, last_prompt_tokens, stored)
            if not due:
                return False
            lease = Lease(
                self.client,
                compaction_lock_key(self.keys, session_key),
                ttl_s=self.lock_ttl_s,
                auto_renew=False,
            )
            if not await lease.acquire(wait=False):
                bound.info("compaction.skipped", reason="in_progress")
                return False
        except Exception as exc:
            _log_failure(bound, "check", exc)
            return False
        try:
            return await self._compact(session_key, last_prompt_tokens, compactions, bound, settings)
        except Exception as exc:
            _log_failure(bound, "compact", exc)
            return False
        finally:
            await lease.release()

    async def _due(
        self, session_key: str, last_prompt_tokens: int, stored: tuple[int, int] | None
    ) -> tuple[bool, int]:
        """Whether the stored session meets the trigger, and its compaction count so far."""
        if stored is not None:
            count, compactions = stored
        else:
            pipe = self.client.pipeline(transaction=True)
            pipe.llen(self.keys.session_messages(session_key))
            pipe.hget(self.keys.session_meta(session_key), "compactions")
            count, compactions = await pipe.execute()
        tokens = last_prompt_tokens
        if tokens <= 0 and count:  # no usage figure: estimate the stored history
            tokens = estimate_tokens(await self.sessions.history(session_key), include_tool_calls=True)
        return should_compact(int(count), tokens, self.cfg.llm.context_window), int(compactions or 0)

    async def _compact(
        self, session_key: str, last_prompt_tokens: int, compactions: int, bound: Any,
        settings: ToolSettings | None = None,
    ) -> bool:
        settings = settings or self.tool_settings  # the session's own directory: its MEMORY.md
        snapshot = await self.sessions.snapshot(session_key)
        if await self.sessions.compaction_count(session_key) != compactions:
            bound.info("compaction.skipped", reason="compacted_meanwhile")
            return False
        if not should_compact(snapshot.stored_count, last_prompt_tokens, self.cfg.llm.context_window):
            bound.info("compaction.skipped", reason="no_longer_due", messages=snapshot.stored_count)
            return False
        run_id = f"compaction-{new_id()}"
        bound = bound.bind(run_id=run_id)
        ctx = ToolContext(
            run_id=run_id,
            session_key=session_key,
            settings=settings,
            policy=ToolPolicy(context="scheduled", allow=("write",)),
        )
        bound.info("compaction.started", messages=snapshot.stored_count, version=snapshot.version)
        result = await compact(
            snapshot.messages,
            model=self.model,
            tools=self.tools,
            ctx=ctx,
            workspace=settings.workspace,
            now=self.clock(),
            previous_summary=snapshot.summary,
            timezone=self.cfg.scheduler.timezone,
            context_window_tokens=self.cfg.llm.context_window,
        )
        stored = await self.sessions.replace_after_compaction(
            session_key,
            result.summary,
            result.keep,
            expected_len=snapshot.stored_count,
            expected_version=snapshot.version,
        )
        if not stored:
            bound.info("compaction.refused", reason="history_changed", messages=snapshot.stored_count)
            return False
        bound.info(
            "compaction.stored",
            summarized=result.summarized,
            kept=len(result.keep),
            flushed=result.flushed,
            summary_chars=len(result.summary),
        )
        return True


def _log_failure(bound: Any, stage: str, exc: Exception) -> None:
    """Expected failures (model, timeout, Redis) as one line; anything else with its traceback."""
    if isinstance(exc, EXPECTED_FAILURES):
        lines = str(exc).strip().splitlines()
        error = f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__
        bound.warning("compaction.failed", stage=stage, error=error)
    else:
        bound.exception("compaction.failed", stage=stage, error_type=type(exc).__name__)
