"""Slack file objects to attachments, and where the bot token may be sent."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from agent.types import Attachment
from channels.slack.files import SlackFiles, message_files


def test_file_objects_become_attachments() -> None:
    raw: list[Any] = [
        {"id": "F1", "name": "a.csv", "mimetype": "text/csv", "size": 12, "url_private_download": "https://files.slack.com/a"},
        {"id": "F2", "mode": "hosted", "file_access": "check_file_info"},
        {"id": "F3", "mode": "tombstone"},
        {"id": "F4", "mode": "external", "name": "gdrive doc"},
        {"name": "no id"},
        "garbage",
        {"id": "F5", "name": "neg", "size": -5},
    ]
    assert message_files(raw) == [
        Attachment(kind="file", file_id="F1", name="a.csv", mime="text/csv", size=12, url="https://files.slack.com/a"),
        Attachment(kind="file", file_id="F2"),
        Attachment(kind="file", file_id="F3", unsupported="it was deleted"),
        Attachment(kind="file", file_id="F4", name="gdrive doc",
                   unsupported="it is a link to an external file, not an upload"),
        Attachment(kind="file", file_id="F5", name="neg"),
    ]
    assert message_files(None) == [] and message_files({"id": "F1"}) == []


@pytest.mark.parametrize(
    ("url", "trusted"),
    [
        ("https://files.slack.com/files-pri/T1-F1/download/a.csv", True),
        ("https://slack.com/x", True),
        ("http://files.slack.com/files-pri/T1-F1/a", False),  # never in clear text
        ("https://files.slack.com.evil.example/a", False),
        ("https://evil.example/?h=files.slack.com", False),
        ("https://slack-edge.com/a", False),
        ("http://127.0.0.1:9999/files-pri/x", True),  # the configured API host (the fake)
        ("http://127.0.0.2:9999/files-pri/x", False),
        ("file:///etc/passwd", False),
    ],
)
async def test_the_token_goes_only_to_slack(url: str, trusted: bool) -> None:
    async with aiohttp.ClientSession() as session:
        files = SlackFiles(api=None, session=session, token="xoxb-t", api_base_url="http://127.0.0.1:9999/api/")  # type: ignore[arg-type]
        assert files._trusted(url) is trusted
