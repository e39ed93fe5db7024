"""Files in the fake Slack: ``files.info``, authenticated downloads at
``url_private_download``, and the external upload flow (``files.getUploadURLExternal``,
the POST to the upload URL, ``files.completeUploadExternal``), as slack-sdk's
``files_upload_v2`` drives it.

``add_file`` registers content and returns the file object a message event carries
(``files=[...]``). Without the bot token a download is redirected to a login page, as
Slack does; ``missing_scope`` makes ``files.info`` answer like an app without
``files:read``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from aiohttp import web

SERVE_CHUNK = 65_536


@dataclass
class SlackUpload:
    """A file uploaded through the external flow (complete once ``completed`` is set)."""

    file_id: str
    filename: str
    length: int
    data: bytes = b""
    completed: dict[str, Any] = field(default_factory=dict)


class SlackFileStore:
    """Mixin for :class:`~tests.fakes.slack_server.FakeSlack`."""

    bot_token: str
    port: int
    team_id: str

    def _init_files(self) -> None:
        self.files: dict[str, dict[str, Any]] = {}
        self.file_data: dict[str, bytes] = {}
        self.uploads: dict[str, SlackUpload] = {}
        self.missing_scope = False  # files.info answers missing_scope, downloads go to the login page
        self.downloads: list[str] = []  # file ids served
        self._file_ids = itertools.count(1)

    def _add_file_routes(self, app: web.Application) -> None:
        app.router.add_get("/files-pri/{team}-{file_id}/download/{name}", self._download)
        app.router.add_post("/upload/v1/{file_id}", self._upload)

    @property
    def _base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add_file(self, data: bytes, name: str, mimetype: str, *, check_file_info: bool = False) -> dict[str, Any]:
        """A file object as a message event carries it; ``check_file_info``: without URLs,
        as Slack sends some files (the client must call ``files.info``)."""
        file_id = f"F{next(self._file_ids):08d}"
        url = f"{self._base}/files-pri/{self.team_id}-{file_id}/download/{quote(name, safe='')}"
        full = {
            "id": file_id, "name": name, "title": name, "mimetype": mimetype,
            "filetype": name.rsplit(".", 1)[-1] if "." in name else "binary", "size": len(data),
            "mode": "hosted", "url_private": url, "url_private_download": url,
        }
        self.files[file_id] = full
        self.file_data[file_id] = data
        if check_file_info:
            return {"id": file_id, "mode": "hosted", "file_access": "check_file_info"}
        return dict(full)

    # -- Web API methods (called by FakeSlack._api) ------------------------------------

    def _m_files_info(self, args: dict[str, Any]) -> dict[str, Any]:
        if self.missing_scope:
            return {"ok": False, "error": "missing_scope", "needed": "files:read", "provided": "chat:write"}
        file = self.files.get(str(args.get("file") or ""))
        if file is None:
            return {"ok": False, "error": "file_not_found"}
        return {"ok": True, "file": file}

    def _m_files_getUploadURLExternal(self, args: dict[str, Any]) -> dict[str, Any]:
        filename, length = str(args.get("filename") or ""), str(args.get("length") or "")
        if not filename or not length.isdigit():
            return {"ok": False, "error": "invalid_arguments"}
        file_id = f"F{next(self._file_ids):08d}"
        self.uploads[file_id] = SlackUpload(file_id, filename, int(length))
        return {"ok": True, "upload_url": f"{self._base}/upload/v1/{file_id}", "file_id": file_id}

    def _m_files_completeUploadExternal(self, args: dict[str, Any]) -> dict[str, Any]:
        import json

        raw = args.get("files")
        files = json.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(files, list) or not files:
            return {"ok": False, "error": "invalid_arguments"}
        done = []
        for item in files:
            upload = self.uploads.get(str(item.get("id")))
            if upload is None or len(upload.data) != upload.length:
                return {"ok": False, "error": "upload_not_found"}
            upload.completed = {
                "channel_id": args.get("channel_id"), "thread_ts": args.get("thread_ts"),
                "initial_comment": args.get("initial_comment"), "title": item.get("title"),
            }
            done.append({"id": upload.file_id, "name": upload.filename, "title": item.get("title")})
        return {"ok": True, "files": done}

    def completed_uploads(self) -> list[SlackUpload]:
        return [u for u in self.uploads.values() if u.completed]

    # -- the file server -----------------------------------------------------------------

    async def _download(self, request: web.Request) -> web.StreamResponse:
        file_id = request.match_info["file_id"]
        if self.missing_scope or request.headers.get("Authorization") != f"Bearer {self.bot_token}":
            raise web.HTTPFound(f"{self._base}/login?redir=files")  # what Slack does without auth
        data = self.file_data.get(file_id)
        if data is None:
            return web.Response(status=404, text="not found")
        self.downloads.append(file_id)
        response = web.StreamResponse(headers={"Content-Type": self.files[file_id]["mimetype"]})
        response.content_length = len(data)
        await response.prepare(request)
        for start in range(0, len(data), SERVE_CHUNK):
            await response.write(data[start : start + SERVE_CHUNK])
        await response.write_eof()
        return response

    async def _upload(self, request: web.Request) -> web.Response:
        upload = self.uploads.get(request.match_info["file_id"])
        if upload is None:
            return web.Response(status=404, text="unknown upload")
        upload.data = await request.read()
        return web.Response(text=f"OK - {len(upload.data)}")
