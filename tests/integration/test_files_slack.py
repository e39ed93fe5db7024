"""Files through Slack, in one process: the real adapter in Socket Mode against the fake
Slack, the real gateway and agent loop, the fake LLM, real Redis."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.openai_server import Call, FakeOpenAI, Reply
from tests.fakes.slack_server import message_event
from tests.integration.files_rig import inbox_files, read, slack_daemon
from tests.integration.gateway_harness import wait_until

pytestmark = pytest.mark.timeout(60)

LINE = re.compile(r"\[attachment: (/[^ ]+) \(([^,]+), (\d+) bytes\)\]")


def last_user_text(body: dict[str, Any]) -> str:
    content = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


async def test_files_of_a_mention_are_downloaded_with_the_bot_token(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    csv, pdf = b"a,b\n1,2\n" * 100, b"%PDF-1.4 fake" * 1000
    async with FakeOpenAI() as llm, slack_daemon(tmp_path, llm, redis_url, redis_prefix) as (slack, daemon):
        llm.script(Reply.text("summed"))
        files = [slack.add_file(csv, "data.csv", "text/csv"), slack.add_file(pdf, "../../etc/passwd", "application/pdf")]
        await slack.push_event(message_event("<@UBOT> sum these", channel="C1", user="U1", ts="10.1",
                                             kind="app_mention", files=files))
        await llm.wait_for_requests(1, timeout_s=10)
        text = last_user_text(llm.requests[0])
        assert text.startswith("sum these\n")
        found = LINE.findall(text)
        assert [(m, int(n)) for _, m, n in found] == [("text/csv", len(csv)), ("application/pdf", len(pdf))]
        paths = [Path(p) for p, _, _ in found]
        assert [read(p) for p in paths] == [csv, pdf]
        # The platform's name is never the path: "../../etc/passwd" did not escape the inbox.
        assert all(p.parent == daemon.cfg.workspace / "inbox" for p in paths)
        assert sorted(slack.downloads) == sorted(f["id"] for f in files)


async def test_file_without_urls_is_looked_up_with_files_info(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with FakeOpenAI() as llm, slack_daemon(tmp_path, llm, redis_url, redis_prefix) as (slack, _daemon):
        llm.script(Reply.text("ok"))
        stub = slack.add_file(b"hello", "note.txt", "text/plain", check_file_info=True)
        await slack.push_event(message_event("", channel="D5", user="U1", ts="11.1", channel_type="im",
                                             subtype="file_share", files=[stub]))
        await llm.wait_for_requests(1, timeout_s=10)
        [(path, mime, size)] = LINE.findall(last_user_text(llm.requests[0]))
        assert (mime, size, read(path)) == ("text/plain", "5", b"hello")
        assert [c.args["file"] for c in slack.calls_to("files.info")] == [stub["id"]]


async def test_missing_files_read_scope_is_named(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with FakeOpenAI() as llm, slack_daemon(tmp_path, llm, redis_url, redis_prefix) as (slack, daemon):
        llm.script(Reply.text("ok"))
        slack.missing_scope = True
        stub = slack.add_file(b"hello", "note.txt", "text/plain", check_file_info=True)
        await slack.push_event(message_event("read it", channel="D5", user="U1", ts="12.1", channel_type="im",
                                             files=[stub]))
        await llm.wait_for_requests(1, timeout_s=10)
        assert "files:read scope" in last_user_text(llm.requests[0])
        await wait_until(lambda: any("files:read" in str(c.args.get("text")) for c in slack.calls_to("chat.postMessage")),
                         what="the notice")
        notices = [c for c in slack.calls_to("chat.postMessage") if "could not take" in str(c.args.get("text"))]
        assert len(notices) == 1
        assert inbox_files(daemon.cfg.workspace) == []


async def test_download_answered_with_the_login_page_names_the_scope(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as llm, slack_daemon(tmp_path, llm, redis_url, redis_prefix) as (slack, daemon):
        llm.script(Reply.text("ok"))
        file = slack.add_file(b"hello", "note.txt", "text/plain")
        slack.missing_scope = True
        await slack.push_event(message_event("read it", channel="D5", user="U1", ts="12.2", channel_type="im",
                                             files=[file]))
        await llm.wait_for_requests(1, timeout_s=10)
        assert 'note.txt" - the Slack app may not read files: add the files:read scope' in last_user_text(llm.requests[0])
        assert inbox_files(daemon.cfg.workspace) == [] and slack.downloads == []


async def test_too_many_files_are_skipped_past_the_limit(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    async with FakeOpenAI() as llm, slack_daemon(
        tmp_path, llm, redis_url, redis_prefix, attachments={"max_files": 2}
    ) as (slack, daemon):
        llm.script(Reply.text("ok"))
        files = [slack.add_file(f"file {i}".encode(), f"f{i}.txt", "text/plain") for i in range(3)]
        await slack.push_event(message_event("three", channel="D5", user="U1", ts="13.1", channel_type="im",
                                             files=files))
        await llm.wait_for_requests(1, timeout_s=10)
        text = last_user_text(llm.requests[0])
        assert len(LINE.findall(text)) == 2
        assert '[attachment skipped: file "f2.txt" - too many files in one message (at most 2)]' in text
        assert len(inbox_files(daemon.cfg.workspace)) == 2


async def test_send_file_uses_the_external_upload_in_the_thread(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    async with FakeOpenAI() as llm, slack_daemon(tmp_path, llm, redis_url, redis_prefix) as (slack, daemon):
        (daemon.cfg.workspace / "out.txt").write_text("the report")
        llm.script(Reply.tool_calls([Call("send_file", {"path": "out.txt", "caption": "here"})]), Reply.text("done"))
        await slack.push_event(message_event("<@UBOT> report please", channel="C1", user="U1", ts="14.1",
                                             kind="app_mention"))
        await wait_until(lambda: bool(slack.completed_uploads()), what="the upload")
        [upload] = slack.completed_uploads()
        assert (upload.filename, upload.data) == ("out.txt", b"the report")
        assert upload.completed["channel_id"] == "C1" and upload.completed["thread_ts"] == "14.1"
        assert upload.completed["initial_comment"] == "here"
        await llm.wait_for_requests(2, timeout_s=10)
        [result] = [m for m in llm.requests[1]["messages"] if m["role"] == "tool"]
        assert result["content"] == "Sent out.txt (10 bytes) to the chat."
