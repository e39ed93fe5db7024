"""Files in and out of a run: inbound attachments fetched into the session's ``inbox/``,
outbound files sent once per run.

Inbound, before the model is asked: each attachment of a request is streamed by its
channel into ``inbox/.<name>.part`` and renamed into place only when it is whole and
within ``attachments.max_bytes``, so no half-written file is ever visible under its
final name (a killed process leaves only ``.part`` files, swept later). Names are ours
(``<received>-<run_id>-<n>.<ext>``: unique, stable across a retried run, so a retry
overwrites instead of duplicating); the platform's file name only lends a safe extension.
The model's user message gets one line per file::

    [attachment: /abs/path (mime/type, N bytes)]

and one ``[attachment skipped: …]`` line per file it will not get, with the reason; the
user is told about skipped files once (the delivery ledger keys the notice).

Outbound: ``send_file`` claims ``file:<digest of path and caption>`` in the delivery
ledger before the upload, so a retried run does not send the same file again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import mimetypes
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import structlog

from agent.guard import scan
from agent.images import NotAnImage, vision_copy
from agent.tools.registry import ToolError
from agent.types import Attachment, RunRequest
from bot.config import BotdConfig
from bot.gateway.reply import DeliveryLedger, notify
from channels.base import (
    ChannelAdapter,
    DeliveryUnknown,
    FileChannel,
    FileTooLarge,
    FileTransferError,
    Target,
)

log = structlog.get_logger(__name__)

INBOX_DIR = "inbox"
PART_SUFFIX = ".part"
STALE_PART_S = 3600.0  # a .part file this old belongs to a download that died
SWEEP_EVERY_S = 3600.0
# Inboxes remembered as swept within the hour; past it the longest-remembered is forgotten
# (its next run sweeps again, a cheap scandir), so a daemon serving many sessions stays bounded.
SWEPT_MEMO_MAX = 256
_SAFE_EXT = re.compile(r"^\.[A-Za-z0-9]{1,10}$")
_MIME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+-]{0,63}/[A-Za-z0-9][A-Za-z0-9.+-]{0,127}$")
_KIND_MIME = {"photo": "image/jpeg", "voice": "audio/ogg", "video_note": "video/mp4", "sticker": "image/webp"}


# The session's workspace directory (``agent.workspace_scope``): where its ``inbox/`` lives.
SessionDir = Callable[[RunRequest], Path]


@dataclass(frozen=True)
class Fetched:
    attachment: Attachment
    path: Path
    mime: str
    size: int


@dataclass(frozen=True)
class Skipped:
    attachment: Attachment
    reason: str


@dataclass
class Prepared:
    """What a request's attachments add to its user message."""

    lines: list[str]
    images: list[str]
    skipped: list[Skipped]


def safe_mime(*claims: str | None) -> str:
    """The first well-formed MIME type among ``claims`` (parameters dropped), else octet-stream."""
    for claim in claims:
        value = (claim or "").split(";", 1)[0].strip().lower()
        if _MIME.match(value):
            return value
    return "application/octet-stream"


def _extension(attachment: Attachment, mime: str) -> str:
    ext = os.path.splitext(attachment.name)[1]
    if _SAFE_EXT.match(ext):
        return ext.lower()
    guessed = mimetypes.guess_extension(mime) or ""
    return guessed if _SAFE_EXT.match(guessed) else ".bin"


def _shown_name(attachment: Attachment) -> str:
    """The platform's file name for messages only: one short line, no quotes or controls,
    and not at all when it reads like an injection (it reaches the model past the guard)."""
    name = re.sub(r"[\x00-\x1f\x7f\"\[\]]", "", attachment.name).strip()[:80]
    return attachment.kind if not name or scan(name) else name


def _size_text(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MB" if size >= 1024 * 1024 else f"{size} bytes"


class Attachments:
    """Fetches a request's attachments and sends files, for the runs of one daemon."""

    def __init__(self, cfg: BotdConfig, ledger: DeliveryLedger, session_dir: SessionDir | None = None) -> None:
        self.cfg = cfg
        self.ledger = ledger
        self.session_dir: SessionDir = session_dir or (lambda _req: cfg.workspace)
        self._swept: dict[str, float] = {}  # inbox -> when it was swept, oldest first

    # ---- in ----------------------------------------------------------------------------

    async def prepare(self, req: RunRequest, channel: ChannelAdapter, target: Target) -> Prepared:
        """Fetch ``req``'s attachments; tell the user once about the ones skipped."""
        results = await self.fetch_all(req, channel)
        fetched = [r for r in results if isinstance(r, Fetched)]
        skipped = [r for r in results if isinstance(r, Skipped)]
        lines = [f"[attachment: {f.path} ({f.mime}, {f.size} bytes)]" for f in fetched]
        lines += [f'[attachment skipped: {s.attachment.kind} "{_shown_name(s.attachment)}" - {s.reason}]' for s in skipped]
        images: list[str] = []
        if self.cfg.llm.vision:
            for f in fetched:
                if f.mime.startswith("image/"):
                    try:
                        images.append(str(await asyncio.to_thread(vision_copy, f.path)))
                    except (NotAnImage, OSError) as exc:
                        log.info("attachments.no_vision_copy", run_id=req.run_id, error=str(exc))
        if skipped:
            text = "I could not take every file you sent:\n" + "\n".join(
                f"- {_shown_name(s.attachment)}: {s.reason}" for s in skipped
            )
            await notify(channel, target, self.ledger, req.run_id, "attachments", text)
        return Prepared(lines, images, skipped)

    async def fetch_all(self, req: RunRequest, channel: ChannelAdapter) -> list[Fetched | Skipped]:
        limits = self.cfg.attachments
        if not req.attachments:
            return []
        if not limits.enabled:
            return [Skipped(a, "receiving files is turned off") for a in req.attachments]
        if not isinstance(channel, FileChannel):
            return [Skipped(a, f"files cannot be received through {channel.name}") for a in req.attachments]
        inbox = self.session_dir(req) / INBOX_DIR
        await asyncio.to_thread(inbox.mkdir, parents=True, exist_ok=True)
        out: list[Fetched | Skipped] = []
        for index, attachment in enumerate(req.attachments):
            if index >= limits.max_files:
                out.append(Skipped(attachment, f"too many files in one message (at most {limits.max_files})"))
                continue
            out.append(await self._fetch(channel, req, inbox, index, attachment))
        return out

    async def _fetch(
        self, channel: FileChannel, req: RunRequest, inbox: Path, index: int, attachment: Attachment
    ) -> Fetched | Skipped:
        max_bytes = self.cfg.attachments.max_bytes
        if attachment.unsupported:
            return Skipped(attachment, attachment.unsupported)
        if attachment.size is not None and attachment.size > max_bytes:
            return Skipped(attachment, f"too large ({_size_text(attachment.size)}; the limit is {_size_text(max_bytes)})")
        claimed = safe_mime(attachment.mime, _KIND_MIME.get(attachment.kind))
        stamp = datetime.fromtimestamp(req.received_at, UTC).strftime("%Y%m%d-%H%M%S")
        base = f"{stamp}-{req.run_id}-{index + 1}"
        part = inbox / f".{base}{PART_SUFFIX}"
        try:
            with part.open("wb") as handle:

                async def sink(chunk: bytes) -> None:
                    handle.write(chunk)

                size, served = await channel.download(attachment, sink, max_bytes)
            # The platform's claim first; what the server said when there was none.
            mime = claimed if claimed != "application/octet-stream" else safe_mime(served)
            final = inbox / f"{base}{_extension(attachment, mime)}"
            os.replace(part, final)
        except FileTooLarge:
            return Skipped(attachment, f"too large (over the limit of {_size_text(max_bytes)})")
        except FileTransferError as exc:
            log.warning("attachments.download_failed", run_id=req.run_id, kind=attachment.kind, error=str(exc))
            return Skipped(attachment, str(exc))
        except OSError as exc:
            log.error("attachments.write_failed", run_id=req.run_id, error=str(exc))
            return Skipped(attachment, "it could not be saved")
        except Exception as exc:  # a channel bug must not cost the person their message
            log.exception("attachments.download_error", run_id=req.run_id, error=repr(exc))
            return Skipped(attachment, "the download failed")
        finally:
            with contextlib.suppress(FileNotFoundError):
                part.unlink()
        return Fetched(attachment, final, mime, size)

    async def sweep(self, req: RunRequest) -> None:
        """Remove the session's inbox files older than ``keep_days`` (and dead ``.part``
        files); called for every run, it scans an inbox at most hourly (unless more than
        ``SWEPT_MEMO_MAX`` others were swept since)."""
        inbox = self.session_dir(req) / INBOX_DIR
        now = time.time()
        if now - self._swept.get(str(inbox), 0.0) < SWEEP_EVERY_S:
            return
        self._remember_swept(str(inbox), now)
        # Most sessions never got a file. One stat of the workspace's own disk (2 µs) spares
        # them the thread hop (64 µs), as the system prompt reads its files inline too.
        if not os.path.isdir(inbox):  # noqa: ASYNC240
            return
        removed = await asyncio.to_thread(sweep_inbox, inbox, self.cfg.attachments.keep_days * 86400, now)
        if removed:
            log.info("attachments.swept", inbox=str(inbox), removed=removed)

    def _remember_swept(self, inbox: str, now: float) -> None:
        self._swept.pop(inbox, None)
        self._swept[inbox] = now  # at the end: the dict stays ordered by sweep time
        while self._swept:
            oldest = next(iter(self._swept))
            if len(self._swept) <= SWEPT_MEMO_MAX and now - self._swept[oldest] < SWEEP_EVERY_S:
                break
            del self._swept[oldest]

    # ---- out ---------------------------------------------------------------------------

    async def send_once(
        self, channel: ChannelAdapter, target: Target, run_id: str, path: Path, caption: str | None
    ) -> str:
        """Send ``path`` to the run's chat unless this run already sent it; the model's answer."""
        if not isinstance(channel, FileChannel):
            raise ToolError(f"Error: files cannot be sent through {channel.name}.")
        size = (await asyncio.to_thread(path.stat)).st_size
        key = "file:" + hashlib.sha256(f"{path}\x00{caption or ''}".encode()).hexdigest()[:24]
        if not await self.ledger.claim(run_id, key):
            return f"{path.name} was already sent in this run; it was not sent again."
        try:
            message_id = await channel.send_file(target, path, caption)
        except FileTransferError as exc:
            await self.ledger.release(run_id, key)  # nothing went out: a later call may try again
            raise ToolError(f"Error: {exc}") from None
        except DeliveryUnknown:
            await self.ledger.mark(run_id, key, "unknown")
            raise ToolError(
                f"Error: no answer came from the chat platform after {path.name} was sent; it may have arrived, "
                "so it was not sent again."
            ) from None
        except Exception:
            await asyncio.shield(self.ledger.mark(run_id, key, "unknown"))
            raise
        await self.ledger.mark(run_id, key, f"sent:{message_id or ''}")
        return f"Sent {path.name} ({_size_text(size)}) to the chat."


def sweep_inbox(inbox: Path, keep_s: float, now: float) -> int:
    """Delete regular files in ``inbox`` older than ``keep_s`` (``.part`` files after an hour)."""
    removed = 0
    try:
        entries = list(os.scandir(inbox))
    except OSError:  # no inbox yet, or unreadable: nothing to do, never a failed run
        return 0
    for entry in entries:
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            age = now - entry.stat(follow_symlinks=False).st_mtime
            limit = STALE_PART_S if entry.name.endswith(PART_SUFFIX) else keep_s
            if age > limit:
                os.unlink(entry.path)
                removed += 1
        except OSError:
            continue
    return removed
