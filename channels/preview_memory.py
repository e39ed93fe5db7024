"""Where a run's live preview is, kept in the shared store under the run id.

A run retried after a crash (SIGKILL, OOM, node loss) gets a new reply stream; through
this record it finds the preview message the dead attempt left and can finalize or
delete it, instead of leaving a stale partial in the chat. Every operation is best
effort: a store hiccup costs at most a stale preview, never the reply.
"""

from __future__ import annotations

import structlog

from channels.base import KeyValue

log = structlog.get_logger(__name__)

TTL_S = 24 * 3600.0


class PreviewMemory:
    """The preview message id of one run in one chat (``None`` kv: remembers nothing)."""

    def __init__(self, kv: KeyValue | None, channel: str, run_id: str, chat_id: str) -> None:
        self._kv = kv
        self._key = f"{channel}:preview:{run_id}"  # relative to the daemon's namespace
        self._chat_id = chat_id
        self._recalled = kv is None

    async def recall(self) -> str | None:
        """The message id a previous attempt stored for this chat; asked once per stream."""
        if self._recalled or self._kv is None:
            return None
        self._recalled = True
        try:
            raw = await self._kv.get(self._key)
        except Exception as exc:
            log.warning("preview.lookup_failed", key=self._key, error=type(exc).__name__)
            return None
        chat, _, message_id = (raw or "").rpartition(":")
        return message_id if chat == self._chat_id and message_id else None

    async def remember(self, message_id: str) -> None:
        if self._kv is None:
            return
        try:
            await self._kv.set(self._key, f"{self._chat_id}:{message_id}", TTL_S)
        except Exception as exc:
            log.warning("preview.store_failed", key=self._key, error=type(exc).__name__)

    async def forget(self) -> None:
        if self._kv is None:
            return
        try:
            await self._kv.delete(self._key)
        except Exception as exc:
            log.warning("preview.store_failed", key=self._key, error=type(exc).__name__)
