"""Files through the Bot API: downloads (``getFile`` + the file URL) and uploads
(``sendPhoto`` for pictures, ``sendDocument`` for everything else).

A download is streamed in chunks from ``<base_file_url><token>/<file_path>`` (httpx),
never read whole: python-telegram-bot's own ``download_*`` helpers hold the file in
memory. Telegram serves bots files up to 20 MB and takes uploads up to 50 MB (photos up
to 10 MB); beyond that the error says so. The file URL holds the bot token: it is never
logged nor put in an error message.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import structlog
from telegram import Message, ReplyParameters
from telegram.error import BadRequest, TelegramError

from agent.types import Attachment
from channels.base import FileSink, FileTooLarge, FileTransferError
from channels.telegram.redact import scrub
from channels.telegram.send import ChatRef, TelegramSender

log = structlog.get_logger(__name__)

DOWNLOAD_LIMIT = 20 * 1024 * 1024  # what getFile serves to bots
UPLOAD_LIMIT = 50 * 1024 * 1024
PHOTO_LIMIT = 10 * 1024 * 1024
PHOTO_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp"})
CAPTION_LIMIT = 1024
CHUNK = 65_536
UPLOAD_TIMEOUT_S = 300.0


class Refused(FileTransferError):
    """Telegram answered the upload with a Bad Request (nothing was sent)."""


def _mb(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MB"


class TelegramFiles:
    """Downloads and uploads for one bot; ``http`` is closed by :meth:`aclose`."""

    def __init__(self, sender: TelegramSender, *, timeout_s: float = 60.0) -> None:
        self.sender = sender
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), follow_redirects=False)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def download(self, attachment: Attachment, sink: FileSink, max_bytes: int) -> tuple[int, str]:
        limit = min(max_bytes, DOWNLOAD_LIMIT)
        if attachment.size is not None and attachment.size > limit:
            raise FileTooLarge(f"{_mb(attachment.size)} is over the limit of {_mb(limit)}")
        try:
            tg_file = await self.sender.bot.get_file(attachment.file_id)
        except BadRequest as exc:
            if "too big" in str(exc).lower():
                raise FileTooLarge("Telegram lets bots download files up to 20 MB") from None
            raise FileTransferError("Telegram could not find the file") from None
        except TelegramError as exc:
            log.warning("telegram.get_file_failed", error=scrub(str(exc)))
            raise FileTransferError("Telegram did not answer for the file") from None
        if tg_file.file_size is not None and tg_file.file_size > limit:
            raise FileTooLarge(f"{_mb(tg_file.file_size)} is over the limit of {_mb(limit)}")
        if not tg_file.file_path:
            raise FileTransferError("Telegram gave no download path for the file")
        return await self._stream(str(tg_file.file_path), sink, limit)

    async def _stream(self, url: str, sink: FileSink, limit: int) -> tuple[int, str]:
        total = 0
        try:
            async with self.http.stream("GET", url) as response:
                if response.status_code != 200:
                    raise FileTransferError(f"the download failed (HTTP {response.status_code})")
                declared = response.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > limit:
                    raise FileTooLarge(f"{_mb(int(declared))} is over the limit of {_mb(limit)}")
                async for chunk in response.aiter_bytes(CHUNK):
                    total += len(chunk)
                    if total > limit:
                        raise FileTooLarge(f"more than {_mb(limit)}")
                    await sink(chunk)
                return total, response.headers.get("content-type", "")
        except httpx.HTTPError as exc:
            # str(exc) may carry the URL, and with it the token.
            raise FileTransferError(f"the download failed ({type(exc).__name__})") from None

    async def send(self, chat: ChatRef, path: Path, caption: str | None) -> Message:
        """Upload ``path``: a photo when it is a small picture, else a document."""
        size = (await asyncio.to_thread(path.stat)).st_size
        if size > UPLOAD_LIMIT:
            raise FileTooLarge(f"{path.name} is {_mb(size)}; Telegram bots can send files up to 50 MB")
        params: dict[str, Any] = {"write_timeout": UPLOAD_TIMEOUT_S, "read_timeout": 60}
        if caption:
            params["caption"] = caption[:CAPTION_LIMIT]
        if chat.thread_id is not None:
            params["message_thread_id"] = chat.thread_id
        if chat.reply_to is not None:
            params["reply_parameters"] = ReplyParameters(chat.reply_to, allow_sending_without_reply=True)
        if path.suffix.lower() in PHOTO_SUFFIXES and size <= PHOTO_LIMIT:
            try:
                return await self._upload(chat, "sendPhoto", path, params)
            except Refused as exc:
                # Not a picture Telegram takes (a long strip, a mislabelled file): as a document.
                # Only a refusal: after a timeout the photo may have arrived, and must not twice.
                log.info("telegram.photo_as_document", error=str(exc))
        return await self._upload(chat, "sendDocument", path, params)

    async def _upload(self, chat: ChatRef, method: str, path: Path, params: dict[str, Any]) -> Message:
        bot = self.sender.bot

        async def call(chat_id: int | str) -> Message:
            with path.open("rb") as handle:  # reopened on each retry
                if method == "sendPhoto":
                    return await bot.send_photo(chat_id, photo=handle, filename=path.name, **params)
                return await bot.send_document(chat_id, document=handle, filename=path.name, **params)

        try:
            return await self.sender.call(chat.chat_id, method, call)
        except BadRequest as exc:
            raise Refused(f"Telegram refused the file: {scrub(str(exc))}") from None
        except TelegramError as exc:
            raise FileTransferError(f"Telegram refused the file: {scrub(str(exc))}") from None
        except OSError as exc:
            raise FileTransferError(f"cannot read {path.name}: {exc.strerror or exc}") from None
