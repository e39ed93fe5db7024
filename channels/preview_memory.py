"""Where a run's live preview is, kept in the shared store under the run id.

A run retried after a crash (SIGKILL, OOM, node loss) gets a new reply stream; through
this record it finds the preview message the dead attempt left and can finalize or
delete it, instead of leaving a stale partial in the chat. Every operation is best
effort: a store hiccup costs at most a stale preview, never the reply.

Only a resumed attempt can find a record it did not write itself, so a first attempt
never asks the store: what its own earlier passes left (a run restarted with more
messages), the channel's :class:`PreviewBook` carries in memory. A run resumed here
keeps asking the store in its later passes until one of them has read the record (a
restart can come before the first pass looked).
"""

from __future__ import annotations

import structlog

from channels.base import KeyValue

log = structlog.get_logger(__name__)

TTL_S = 24 * 3600.0
# Runs the book keeps facts about. Entries live from a preview's post to its end, or
# from a resumed attempt's start to its first read, so a few hundred are plenty; the
# oldest go first, and forgetting one costs at most one stale preview.
BOOK_CAPACITY = 4096


class PreviewBook:
    """One channel's preview records as this process knows them (one per adapter)."""

    def __init__(self, kv: KeyValue | None, channel: str, *, capacity: int = BOOK_CAPACITY) -> None:
        self.kv = kv
        self.channel = channel
        self._capacity = capacity
        self._carried: dict[str, str] = {}  # run id -> "chat:message" this process stored, not yet cleared
        self._unread: dict[str, str] = {}  # run ids resumed here whose stored record no pass has read

    def memory(self, run_id: str, chat_id: str, *, resumed: bool = True) -> PreviewMemory:
        """The record of ``run_id`` for one stream; ``resumed``: a previous attempt of the
        run may have left a preview (False only when the caller knows there was none)."""
        if resumed:
            self._keep(self._unread, run_id, "")
        return PreviewMemory(self, run_id, chat_id, resumed=resumed or run_id in self._unread)

    def carried(self, run_id: str) -> str | None:
        return self._carried.get(run_id)

    def stored(self, run_id: str, value: str) -> None:
        """``value`` was written to the store for ``run_id``: this process knows the record."""
        self._unread.pop(run_id, None)
        self._keep(self._carried, run_id, value)

    def carry(self, run_id: str, value: str) -> None:
        """This process has a preview for ``run_id`` (the store may not know it)."""
        self._keep(self._carried, run_id, value)

    def read(self, run_id: str, value: str | None) -> None:
        """The store answered ``value`` for ``run_id``."""
        self._unread.pop(run_id, None)
        if value:
            self._keep(self._carried, run_id, value)
        else:
            self._carried.pop(run_id, None)

    def cleared(self, run_id: str) -> None:
        """The run's preview is gone or final: nothing is left to find."""
        self._carried.pop(run_id, None)

    def _keep(self, book: dict[str, str], run_id: str, value: str) -> None:
        book.pop(run_id, None)  # re-inserted: the newest go last, the oldest are dropped first
        book[run_id] = value
        while len(book) > self._capacity:
            del book[next(iter(book))]


class PreviewMemory:
    """The preview message id of one run in one chat, for one reply stream."""

    def __init__(self, book: PreviewBook, run_id: str, chat_id: str, *, resumed: bool = True) -> None:
        self._book = book
        self._kv = book.kv
        self._run_id = run_id
        self._key = f"{book.channel}:preview:{run_id}"  # relative to the daemon's namespace
        self._chat_id = chat_id
        self._resumed = resumed
        self._recalled = False
        self._may_be_stored = False  # a record may be in the store: forget() has something to delete

    async def recall(self) -> str | None:
        """The message id an earlier attempt or pass left for this chat; asked once per stream,
        of the store only when the run was resumed (else this process would know)."""
        if self._recalled or self._kv is None:
            return None
        self._recalled = True
        if self._resumed:
            try:
                raw = await self._kv.get(self._key)
            except Exception as exc:
                log.warning("preview.lookup_failed", key=self._key, error=type(exc).__name__)
                self._may_be_stored = True
                return None
            self._book.read(self._run_id, raw)
        else:
            raw = self._book.carried(self._run_id)
        self._may_be_stored = bool(raw)
        chat, _, message_id = (raw or "").rpartition(":")
        return message_id if chat == self._chat_id and message_id else None

    async def remember(self, message_id: str) -> None:
        if self._kv is None:
            return
        value = f"{self._chat_id}:{message_id}"
        self._book.carry(self._run_id, value)  # this process knows it, whatever the store does
        self._may_be_stored = True
        try:
            await self._kv.set(self._key, value, TTL_S)
        except Exception as exc:
            log.warning("preview.store_failed", key=self._key, error=type(exc).__name__)
            return
        self._book.stored(self._run_id, value)

    async def forget(self) -> None:
        """The preview is gone or final; deletes the record when one may have been stored
        (by this stream, or found by its recall)."""
        self._book.cleared(self._run_id)
        if self._kv is None or not self._may_be_stored:
            return
        try:
            await self._kv.delete(self._key)
        except Exception as exc:
            log.warning("preview.store_failed", key=self._key, error=type(exc).__name__)
            return
        self._may_be_stored = False
