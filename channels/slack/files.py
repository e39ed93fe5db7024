"""Files through Slack: the ``files[]`` of a message in, the external upload flow out.

In: a message's file objects become :class:`~agent.types.Attachment` (a file Slack sends
without URLs, ``file_access: check_file_info``, is looked up with ``files.info`` when it is
fetched). The download is a GET of ``url_private_download`` with the bot token, streamed
in chunks. The token is only ever sent to Slack's own hosts (or the configured API host);
Slack answers a download it does not authorize with a redirect to its login page (or an
HTML page), which is what an app without the ``files:read`` scope gets: that, and
``missing_scope`` from ``files.info``, become one clear message naming the scope.

Out: slack-sdk's ``files_upload_v2`` (``files.getUploadURLExternal``, the upload,
``files.completeUploadExternal`` with the channel and thread).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import structlog

from agent.types import Attachment
from channels.base import FileSink, FileTooLarge, FileTransferError, Target
from channels.slack.api import SlackApi, SlackCallError

log = structlog.get_logger(__name__)

NEEDS_FILES_READ = (
    "the Slack app may not read files: add the files:read scope to the app and reinstall it"
)
CHUNK = 65_536
MAX_FILES_PER_MESSAGE = 100  # more is not a message a person sent
_DOWNLOAD_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)


def message_files(raw: Any) -> list[Attachment]:
    """The attachments of a message event's ``files`` (deleted and external files marked
    unsupported, so the model and the person hear of them)."""
    if not isinstance(raw, list):
        return []
    out: list[Attachment] = []
    for item in raw[:MAX_FILES_PER_MESSAGE]:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            continue
        size = item.get("size")
        name = str(item.get("name") or item.get("title") or "")[:255]
        if item.get("mode") in ("tombstone", "external"):
            why = "it was deleted" if item["mode"] == "tombstone" else "it is a link to an external file, not an upload"
            out.append(Attachment(kind="file", file_id=item["id"][:64], name=name, unsupported=why))
            continue
        url = item.get("url_private_download") or item.get("url_private")
        out.append(Attachment(
            kind="file",
            file_id=item["id"][:64],
            name=name,
            mime=str(item.get("mimetype") or "")[:200],
            size=size if isinstance(size, int) and size >= 0 else None,
            url=url if isinstance(url, str) else None,
        ))
    return out


class SlackFiles:
    """Downloads and uploads for one bot token."""

    def __init__(self, api: SlackApi, session: aiohttp.ClientSession, token: str, api_base_url: str) -> None:
        self._api = api
        self._session = session
        self._token = token
        self._api_host = urlsplit(api_base_url).hostname or ""

    def _trusted(self, url: str) -> bool:
        """May the bot token go to ``url``? Only Slack's hosts (or the configured API host)."""
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if host == self._api_host:
            return parts.scheme in ("https", "http")
        return parts.scheme == "https" and (host == "slack.com" or host.endswith(".slack.com"))

    async def download(self, attachment: Attachment, sink: FileSink, max_bytes: int) -> tuple[int, str]:
        url, size = attachment.url, attachment.size
        if url is None:
            info = await self._info(attachment.file_id)
            url = info.get("url_private_download") or info.get("url_private")
            size = info.get("size") if isinstance(info.get("size"), int) else None
        if size is not None and size > max_bytes:
            raise FileTooLarge(f"{size} bytes is over the limit of {max_bytes}")
        if not isinstance(url, str) or not self._trusted(url):
            raise FileTransferError("Slack gave no download address for the file")
        headers = {"Authorization": f"Bearer {self._token}"}
        total = 0
        try:
            async with self._session.get(url, headers=headers, allow_redirects=False,
                                         timeout=_DOWNLOAD_TIMEOUT) as response:
                if 300 <= response.status < 400 or response.status in (401, 403):
                    raise FileTransferError(NEEDS_FILES_READ)
                if response.status != 200:
                    raise FileTransferError(f"the download failed (HTTP {response.status})")
                served = response.headers.get("Content-Type", "")
                if served.startswith("text/html") and "html" not in attachment.mime:
                    raise FileTransferError(NEEDS_FILES_READ)  # Slack's sign-in page, not the file
                async for chunk in response.content.iter_chunked(CHUNK):
                    total += len(chunk)
                    if total > max_bytes:
                        raise FileTooLarge(f"more than {max_bytes} bytes")
                    await sink(chunk)
                return total, served
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise FileTransferError(f"the download failed ({type(exc).__name__})") from None

    async def _info(self, file_id: str) -> dict[str, Any]:
        try:
            data = await self._api.call("files.info", file=file_id)
        except SlackCallError as exc:
            if exc.error == "missing_scope":
                log.warning("slack.files_read_missing", hint="add the files:read scope to the Slack app")
                raise FileTransferError(NEEDS_FILES_READ) from None
            raise FileTransferError(f"Slack could not describe the file ({exc.error})") from None
        file = data.get("file")
        if not isinstance(file, dict):
            raise FileTransferError("Slack could not describe the file")
        return file

    async def send(self, target: Target, path: Path, caption: str | None) -> str | None:
        args: dict[str, Any] = {"channel": target.chat_id, "file": str(path), "filename": path.name,
                                "title": path.name}
        if target.thread_id:
            args["thread_ts"] = target.thread_id
        if caption:
            args["initial_comment"] = caption
        try:
            data = await self._api.call("files.upload_v2", **args)
        except SlackCallError as exc:
            hint = " (add the files:write scope to the Slack app)" if exc.error == "missing_scope" else ""
            raise FileTransferError(f"Slack refused the file: {exc.error}{hint}") from None
        except OSError as exc:
            raise FileTransferError(f"cannot read {path.name}: {exc.strerror or exc}") from None
        file = data.get("file")
        return str(file.get("id")) if isinstance(file, dict) else None
