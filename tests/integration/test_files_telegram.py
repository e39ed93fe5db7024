"""Files through Telegram, end to end in one process: the real adapter polling the fake Bot
API, the real gateway and agent loop, the fake LLM, real Redis."""

from __future__ import annotations

import asyncio
import base64
import io
import re
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.integration.files_rig import USER, inbox_files, jpeg_bytes, read, telegram_daemon
from tests.integration.gateway_harness import wait_until

pytestmark = pytest.mark.timeout(60)

LINE = re.compile(r"\[attachment: (/[^ ]+) \(([^,]+), (\d+) bytes\)\]")


def last_user_text(body: dict[str, Any]) -> str:
    message = [m for m in body["messages"] if m["role"] == "user"][-1]
    content = message["content"]
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if p.get("type") == "text")
    return str(content)


async def test_photo_with_caption_reaches_the_model_as_a_file(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    photo = jpeg_bytes(800, 600)
    async with FakeOpenAI() as llm, telegram_daemon(tmp_path, llm, redis_url, redis_prefix) as (tg, daemon):
        llm.script(Reply.text("a red square"))
        media = tg.photo_media(photo)
        tg.push_message(tg.private_message(USER, caption="what is this?", media=media))
        await llm.wait_for_requests(1, timeout_s=10)
        text = last_user_text(llm.requests[0])
        assert text.startswith("what is this?\n")
        [(path, mime, size)] = LINE.findall(text)
        assert (mime, int(size)) == ("image/jpeg", len(photo))
        stored = Path(path)
        assert stored.parent == daemon.cfg.workspace / "inbox" and stored.suffix == ".jpg"
        assert read(stored) == photo
        assert llm.image_urls(0) == []  # llm.vision is off by default
        # The largest size was fetched, not the thumbnail Telegram lists first.
        [get_file] = tg.calls_to("getFile")
        assert get_file.params["file_id"] == media["photo"][1]["file_id"]


async def test_files_go_to_the_inbox_of_the_users_own_directory(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with FakeOpenAI() as llm, telegram_daemon(
        tmp_path, llm, redis_url, redis_prefix, agent={"workspace_scope": "user"}
    ) as (tg, daemon):
        llm.script(Reply.text("ok"))
        tg.push_message(tg.private_message(USER, media=tg.document_media(b"1,2\n", "a.csv", "text/csv")))
        await llm.wait_for_requests(1, timeout_s=10)
        [(path, _mime, _size)] = LINE.findall(last_user_text(llm.requests[0]))
        assert Path(path).parent == daemon.cfg.workspace / "users" / f"telegram-{USER}" / "inbox"
        assert read(path) == b"1,2\n"


@pytest.mark.parametrize(
    ("kind", "fields", "mime", "suffix"),
    [
        ("document", {"name": "report.pdf", "mime": "application/pdf"}, "application/pdf", ".pdf"),
        ("audio", {"file_name": "song.mp3"}, "audio/mpeg", ".mp3"),
        ("voice", {}, "audio/ogg", ".ogg"),
        ("video", {"file_name": "clip.mp4"}, "video/mp4", ".mp4"),
        ("video_note", {}, "video/mp4", ".mp4"),
        ("sticker", {"emoji": "😀"}, "image/webp", ".webp"),
    ],
)
async def test_every_kind_of_file_is_fetched(
    tmp_path: Path, redis_url: str, redis_prefix: str, kind: str, fields: dict[str, str], mime: str, suffix: str
) -> None:
    data = bytes(range(256)) * 40
    async with FakeOpenAI() as llm, telegram_daemon(tmp_path, llm, redis_url, redis_prefix) as (tg, _daemon):
        llm.script(Reply.text("got it"))
        if kind == "document":
            media = tg.document_media(data, fields["name"], fields["mime"])
        else:
            media = tg.media_of(kind, data, **fields)
        tg.push_message(tg.private_message(USER, media=media))
        await llm.wait_for_requests(1, timeout_s=10)
        text = last_user_text(llm.requests[0])
        [(path, got_mime, size)] = LINE.findall(text)
        assert text == f"[attachment: {path} ({mime}, {len(data)} bytes)]"  # no caption: the line alone
        assert (got_mime, int(size)) == (mime, len(data))
        assert Path(path).suffix == suffix and read(path) == data


async def test_album_is_one_run_with_all_its_files(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    first, second = jpeg_bytes(300, 200), jpeg_bytes(200, 300)
    async with FakeOpenAI() as llm, telegram_daemon(tmp_path, llm, redis_url, redis_prefix) as (tg, _daemon):
        llm.script(Reply.text("two pictures"))
        album = {"media_group_id": "1337"}
        tg.push_message(tg.private_message(USER, caption="compare", media=tg.photo_media(first), extra=album))
        tg.push_message(tg.private_message(USER, media=tg.photo_media(second), extra=album))
        await llm.wait_for_requests(1, timeout_s=10)
        await wait_until(lambda: bool(tg.sent_messages(USER)), what="the answer")
        assert len(llm.requests) == 1
        body = llm.requests[0]
        files = [Path(p) for m in body["messages"] if m["role"] == "user" for p, _, _ in LINE.findall(str(m["content"]))]
        assert [read(f) for f in files] == [first, second]


async def test_group_album_is_addressed_by_its_first_item(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    first, second = jpeg_bytes(300, 200), jpeg_bytes(200, 300)
    async with FakeOpenAI() as llm, telegram_daemon(tmp_path, llm, redis_url, redis_prefix) as (tg, _daemon):
        llm.script(Reply.text("two pictures"))
        album = {"media_group_id": "4242"}
        tg.push_message(tg.group_message(-1001, USER, caption="@botd_test_bot compare", media=tg.photo_media(first),
                                         extra=album))
        tg.push_message(tg.group_message(-1001, USER, media=tg.photo_media(second), extra=album))
        # Not part of the album: an unaddressed photo stays ignored.
        tg.push_message(tg.group_message(-1001, USER, media=tg.photo_media(b"other"), extra={"media_group_id": "1"}))
        await llm.wait_for_requests(1, timeout_s=10)
        await wait_until(lambda: bool(tg.sent_messages(-1001)), what="the answer")
        body = llm.requests[0]
        files = [Path(p) for m in body["messages"] if m["role"] == "user" for p, _, _ in LINE.findall(str(m["content"]))]
        assert [read(f) for f in files] == [first, second]
        assert len(llm.requests) == 1


async def test_file_over_the_limit_is_skipped_and_the_user_told_once(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    big = b"x" * 5000
    async with FakeOpenAI() as llm, telegram_daemon(
        tmp_path, llm, redis_url, redis_prefix, attachments={"max_bytes": 4096}
    ) as (tg, daemon):
        llm.script(Reply.text("ok"))
        tg.push_message(tg.private_message(USER, caption="read this", media=tg.document_media(big, "a.txt", "text/plain")))
        await llm.wait_for_requests(1, timeout_s=10)
        text = last_user_text(llm.requests[0])
        assert text.startswith("read this\n[attachment skipped: document \"a.txt\" - too large")
        assert "[attachment:" not in text
        await wait_until(lambda: len(tg.sent_messages(USER)) >= 2, what="the notice and the answer")
        notices = [m for m in tg.sent_messages(USER) if "could not take" in m.text]
        assert len(notices) == 1 and "a.txt" in notices[0].text and "too large" in notices[0].text
        assert inbox_files(daemon.cfg.workspace) == []
        assert not tg.calls_to("getFile")  # the declared size was enough to refuse it


async def test_failed_download_leaves_nothing_behind(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with FakeOpenAI() as llm, telegram_daemon(tmp_path, llm, redis_url, redis_prefix) as (tg, daemon):
        llm.script(Reply.text("ok"))
        media = tg.document_media(b"y" * 3000, "data.csv", "text/csv")
        tg.download_faults[media["document"]["file_id"]] = 502
        tg.push_message(tg.private_message(USER, caption="sum it", media=media))
        await llm.wait_for_requests(1, timeout_s=10)
        text = last_user_text(llm.requests[0])
        assert 'attachment skipped: document "data.csv" - the download failed (HTTP 502)' in text
        assert inbox_files(daemon.cfg.workspace) == []


async def test_download_bigger_than_declared_is_cut_off(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with FakeOpenAI() as llm, telegram_daemon(
        tmp_path, llm, redis_url, redis_prefix, attachments={"max_bytes": 100_000}
    ) as (tg, daemon):
        llm.script(Reply.text("ok"))
        media = tg.document_media(b"z" * 10, "small.bin", "application/octet-stream")
        media["document"]["file_size"] = 10  # the message lies about the size
        tg.files[media["document"]["file_id"]] = b"z" * 300_000
        tg.push_message(tg.private_message(USER, media=media))
        await llm.wait_for_requests(1, timeout_s=10)
        assert "too large" in last_user_text(llm.requests[0])
        assert inbox_files(daemon.cfg.workspace) == []


async def test_vision_sends_the_photo_downscaled(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    photo = jpeg_bytes(3000, 2000)
    async with FakeOpenAI() as llm, telegram_daemon(
        tmp_path, llm, redis_url, redis_prefix, llm={"vision": True}
    ) as (tg, _daemon):
        llm.script(Reply.text("red"))
        tg.push_message(tg.private_message(USER, caption="colour?", media=tg.photo_media(photo, width=3000, height=2000)))
        await llm.wait_for_requests(1, timeout_s=10)
        [url] = llm.image_urls(0)
        assert url.startswith("data:image/jpeg;base64,")
        img = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
        assert img.size == (1568, 1045)
        assert "[attachment: " in last_user_text(llm.requests[0])  # the path is there too


async def test_vision_history_keeps_the_newest_images_within_its_budget(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    first, second = jpeg_bytes(400, 300), jpeg_bytes(300, 400)
    async with FakeOpenAI() as llm, telegram_daemon(
        tmp_path, llm, redis_url, redis_prefix, llm={"vision": True, "context_window": 8000}  # room for one image
    ) as (tg, daemon):
        llm.script(Reply.text("one"), Reply.text("two"))
        tg.push_message(tg.private_message(USER, caption="first", media=tg.photo_media(first)))
        await wait_until(lambda: len(tg.sent_messages(USER)) == 1, what="the first answer")
        tg.push_message(tg.private_message(USER, caption="second", media=tg.photo_media(second)))
        await llm.wait_for_requests(2, timeout_s=10)
        assert len(llm.image_urls(0)) == 1
        [newest] = llm.image_urls(1)
        assert Image.open(io.BytesIO(base64.b64decode(newest.split(",", 1)[1]))).size == (300, 400)
        texts = [last_user_text({"messages": [m]}) for m in llm.requests[1]["messages"] if m["role"] == "user"]
        assert texts[0].startswith("first\n[attachment: ")  # the old image's text stays
        # The stored session refers to the copies; it does not hold the pictures.
        await wait_until(lambda: len(tg.sent_messages(USER)) == 2, what="the second answer")
        # The session is read from the store: poll until the second run shows there.
        sessions = daemon.app.sessions  # type: ignore[union-attr]
        refs: list[str] = []
        for _ in range(250):
            refs = [ref for m in await sessions.history("agent:main:telegram:dm:42") for ref in (m.images or [])]
            if len(refs) == 2:
                break
            await asyncio.sleep(0.02)
        assert len(refs) == 2 and all(r.endswith(".vision.jpg") and Path(r).parent.name == "inbox" for r in refs)


async def test_send_file_uploads_a_document_and_a_photo(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with FakeOpenAI() as llm, telegram_daemon(tmp_path, llm, redis_url, redis_prefix) as (tg, daemon):
        ws = daemon.cfg.workspace
        (ws / "report.csv").write_text("a,b\n1,2\n")
        (ws / "chart.png").write_bytes(_png())
        llm.script(
            Reply.tool_calls([Call("send_file", {"path": "report.csv", "caption": "the report"}),
                              Call("send_file", {"path": str(ws / "chart.png")})]),
            Reply.text("sent both"),
        )
        tg.push_message(tg.private_message(USER, "send me the report"))
        await wait_until(lambda: len(tg.uploads) == 2 and bool(tg.sent_messages(USER)), what="two uploads")
        by_method = {u.method: u for u in tg.uploads}
        doc, photo = by_method["sendDocument"], by_method["sendPhoto"]
        assert (doc.chat_id, doc.filename, doc.data, doc.caption) == (USER, "report.csv", b"a,b\n1,2\n", "the report")
        assert photo.filename == "chart.png" and photo.data == _png()
        results = [m for m in llm.requests[1]["messages"] if m["role"] == "tool"]
        assert [r["content"] for r in results] == ["Sent report.csv (8 bytes) to the chat.", "Sent chart.png "
                                                   f"({len(_png())} bytes) to the chat."]


async def test_a_picture_telegram_refuses_as_a_photo_goes_as_a_document(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as llm, telegram_daemon(tmp_path, llm, redis_url, redis_prefix) as (tg, daemon):
        (daemon.cfg.workspace / "strip.png").write_bytes(_png())
        tg.fail_next("sendPhoto", description="Bad Request: PHOTO_INVALID_DIMENSIONS")
        llm.script(Reply.tool_calls([Call("send_file", {"path": "strip.png"})]), Reply.text("sent"))
        tg.push_message(tg.private_message(USER, "send the strip"))
        await llm.wait_for_requests(2, timeout_s=10)
        [upload] = tg.uploads
        assert (upload.method, upload.filename) == ("sendDocument", "strip.png")
        [result] = [m for m in llm.requests[1]["messages"] if m["role"] == "tool"]
        assert result["content"].startswith("Sent strip.png")


async def test_a_file_whose_answer_was_lost_is_not_sent_again(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with FakeOpenAI() as llm, telegram_daemon(tmp_path, llm, redis_url, redis_prefix) as (tg, daemon):
        (daemon.cfg.workspace / "report.csv").write_text("a,b\n1,2\n")
        tg.drop_next("sendDocument", after_effect=True)  # uploaded, and the answer lost on the way
        llm.script(Reply.tool_calls([Call("send_file", {"path": "report.csv"})]),
                   Reply.tool_calls([Call("send_file", {"path": "report.csv"})]), Reply.text("done"))
        tg.push_message(tg.private_message(USER, "send the report"))
        await llm.wait_for_requests(3, timeout_s=10)
        assert [u.filename for u in tg.uploads] == ["report.csv"]
        first = [m for m in llm.requests[1]["messages"] if m["role"] == "tool"][-1]
        assert "may have arrived" in first["content"] and "not sent again" in first["content"]
        second = [m for m in llm.requests[2]["messages"] if m["role"] == "tool"][-1]
        assert "already sent in this run" in second["content"]  # the model's retry sends nothing


async def test_send_file_outside_the_allowed_paths_is_refused(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    secret = tmp_path / "outside.txt"
    secret.write_text("not yours")
    async with FakeOpenAI() as llm, telegram_daemon(tmp_path, llm, redis_url, redis_prefix) as (tg, _daemon):
        llm.script(Reply.tool_calls([Call("send_file", {"path": str(secret)})]), Reply.text("could not"))
        tg.push_message(tg.private_message(USER, "send the secret"))
        await llm.wait_for_requests(2, timeout_s=10)
        [result] = [m for m in llm.requests[1]["messages"] if m["role"] == "tool"]
        assert "outside the allowed paths" in result["content"]
        assert tg.uploads == [] and not tg.calls_to("sendDocument")


async def test_send_file_over_50_mb_is_a_clear_error(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with FakeOpenAI() as llm, telegram_daemon(tmp_path, llm, redis_url, redis_prefix) as (tg, daemon):
        huge = daemon.cfg.workspace / "huge.bin"
        with huge.open("wb") as handle:
            handle.truncate(51 * 1024 * 1024)  # sparse: no 51 MB written
        llm.script(Reply.tool_calls([Call("send_file", {"path": "huge.bin"})]), Reply.text("too big"))
        tg.push_message(tg.private_message(USER, "send the big one"))
        await llm.wait_for_requests(2, timeout_s=10)
        [result] = [m for m in llm.requests[1]["messages"] if m["role"] == "tool"]
        assert "up to 50 MB" in result["content"] and "Error" in result["content"]
        assert not tg.calls_to("sendDocument")


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGBA", (64, 32), (0, 128, 0, 128)).save(out, format="PNG")
    return out.getvalue()
