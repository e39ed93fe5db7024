"""Files in the fake Bot API: ``getFile``, downloads at ``/file/bot<token>/<file_path>``,
and ``sendPhoto`` / ``sendDocument`` uploads (multipart), with Telegram's limits.

Tests register content with :meth:`FileStore.add_file` and put the descriptor into a
message (``photo_media``, ``document_media``, ``media_of``); the fake serves it in chunks
like Telegram's file server. Uploads are kept in ``uploads``.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

DOWNLOAD_LIMIT = 20 * 1024 * 1024
UPLOAD_LIMIT = 50 * 1024 * 1024
PHOTO_LIMIT = 10 * 1024 * 1024
SERVE_CHUNK = 65_536


@dataclass
class Upload:
    """A file part of a multipart request."""

    filename: str
    content_type: str
    data: bytes


@dataclass
class SentFile:
    """A photo or document the bot sent."""

    method: str  # sendPhoto | sendDocument
    chat_id: int
    filename: str
    data: bytes
    caption: str | None
    thread_id: int | None
    message: dict[str, Any]


class FileStore:
    """Mixin for :class:`~tests.fakes.telegram_server.FakeTelegram`."""

    token: str
    files: dict[str, bytes]
    file_paths: dict[str, str]
    uploads: list[SentFile]
    download_faults: dict[str, int]  # file_id -> HTTP status to answer downloads with
    bot_user: dict[str, Any]

    def _init_files(self) -> None:
        self.files = {}
        self.file_paths = {}
        self.uploads = []
        self.download_faults = {}

    def add_file(self, data: bytes, *, folder: str = "documents", ext: str = "bin") -> dict[str, Any]:
        """Register ``data`` and return its descriptor (``file_id``, ``file_unique_id``, ``file_size``)."""
        digest = hashlib.sha256(data).hexdigest()[:20]
        file_id = f"F{len(self.files) + 1}_{digest}"
        self.files[file_id] = data
        self.file_paths[file_id] = f"{folder}/file_{len(self.files)}.{ext}"
        return {"file_id": file_id, "file_unique_id": f"U{digest}", "file_size": len(data)}

    def photo_media(self, data: bytes, *, width: int = 1280, height: int = 960) -> dict[str, Any]:
        """``photo``: a small thumbnail and the full size, as Telegram lists them."""
        thumb = self.add_file(data[:1000] or b"x", folder="photos", ext="jpg")
        full = self.add_file(data, folder="photos", ext="jpg")
        return {"photo": [
            {**thumb, "width": 90, "height": 67},
            {**full, "width": width, "height": height},
        ]}

    def document_media(self, data: bytes, name: str, mime: str) -> dict[str, Any]:
        ext = name.rsplit(".", 1)[-1] if "." in name else "bin"
        return {"document": {**self.add_file(data, ext=ext[:8]), "file_name": name, "mime_type": mime}}

    def media_of(self, kind: str, data: bytes, **fields: Any) -> dict[str, Any]:
        """``audio``, ``voice``, ``video``, ``video_note`` or ``sticker`` with ``data``."""
        base = self.add_file(data, folder=kind + "s")
        defaults: dict[str, dict[str, Any]] = {
            "audio": {"duration": 3, "mime_type": "audio/mpeg"},
            "voice": {"duration": 2, "mime_type": "audio/ogg"},
            "video": {"duration": 4, "width": 640, "height": 480, "mime_type": "video/mp4"},
            "video_note": {"duration": 4, "length": 240},
            "sticker": {"type": "regular", "width": 512, "height": 512, "is_animated": False, "is_video": False},
        }
        return {kind: {**base, **defaults[kind], **fields}}

    # -- Bot API methods -------------------------------------------------------------------

    async def _m_getFile(self, p: dict[str, Any]) -> Any:
        from tests.fakes.telegram_server import ApiError

        file_id = str(p.get("file_id") or "")
        data = self.files.get(file_id)
        if data is None:
            raise ApiError(400, "Bad Request: invalid file_id")
        if len(data) > DOWNLOAD_LIMIT:
            raise ApiError(400, "Bad Request: file is too big")
        digest = hashlib.sha256(data).hexdigest()[:20]
        return {"file_id": file_id, "file_unique_id": f"U{digest}", "file_size": len(data),
                "file_path": self.file_paths[file_id]}

    async def _m_sendPhoto(self, p: dict[str, Any]) -> Any:
        return self._sent_file("sendPhoto", "photo", p)

    async def _m_sendDocument(self, p: dict[str, Any]) -> Any:
        return self._sent_file("sendDocument", "document", p)

    def _sent_file(self, method: str, field: str, p: dict[str, Any]) -> dict[str, Any]:
        from tests.fakes.telegram_server import ApiError

        upload = p.get(field)
        if not isinstance(upload, Upload):
            raise ApiError(400, f"Bad Request: there is no {field} in the request")
        if len(upload.data) > UPLOAD_LIMIT:
            raise ApiError(413, "Request Entity Too Large")
        if not upload.data:
            raise ApiError(400, "Bad Request: file must be non-empty")
        if method == "sendPhoto" and len(upload.data) > PHOTO_LIMIT:
            raise ApiError(400, "Bad Request: PHOTO_SAVE_FILE_INVALID")
        chat = self._chat_of(p)  # type: ignore[attr-defined]
        chat_id = int(chat["id"])
        thread = p.get("message_thread_id")
        descriptor = self.add_file(upload.data)
        media: dict[str, Any]
        if method == "sendPhoto":
            media = {"photo": [{**descriptor, "width": 100, "height": 100}]}
        else:
            media = {"document": {**descriptor, "file_name": upload.filename}}
        msg: dict[str, Any] = {
            "message_id": self._message_id(chat_id),  # type: ignore[attr-defined]
            "from": self.bot_user, "chat": chat, "date": int(time.time()), **media,
        }
        caption = p.get("caption")
        if caption:
            msg["caption"] = str(caption)
        self.uploads.append(SentFile(method, chat_id, upload.filename, upload.data,
                                     str(caption) if caption else None, int(thread) if thread else None, msg))
        return msg

    # -- the file server -------------------------------------------------------------------

    async def _serve_file(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return web.json_response({"ok": False, "error_code": 401, "description": "Unauthorized"}, status=401)
        path = request.match_info["path"]
        file_id = next((fid for fid, p in self.file_paths.items() if p == path), None)
        if file_id is None:
            return web.json_response({"ok": False, "error_code": 404, "description": "Not Found"}, status=404)
        if file_id in self.download_faults:
            return web.Response(status=self.download_faults[file_id], text="fault")
        data = self.files[file_id]
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = len(data)
        await response.prepare(request)
        view = memoryview(data)
        for start in range(0, len(data), SERVE_CHUNK):
            await response.write(bytes(view[start : start + SERVE_CHUNK]))
        await response.write_eof()
        return response
