"""The gateway benchmark's channel records nothing once told not to keep: its lists are
the benchmark's, and the memory part counts this process's RSS as botd's."""

from __future__ import annotations

from bench.gateway_rig import BenchChannel
from channels.base import Target


async def test_keep_false_records_no_stream_part_or_preview() -> None:
    channel = BenchChannel()
    target = Target("test", "chat-1")
    part_seen = channel.expect("chat-1")
    preview_seen = channel.expect_preview("run-1")
    channel.keep = False

    stream = channel.open_stream(target, "run-1", resumed=False)
    await stream.preview("partial")
    await stream.deliver(0, "answer")
    await stream.discard()
    await channel.send_text(target, "notice")

    assert part_seen.done() and preview_seen.done()  # the waiters still fire
    assert (channel.opened, channel.previews, channel.sent, channel.discarded) == ([], [], [], [])


async def test_keep_true_records_everything() -> None:
    channel = BenchChannel()
    target = Target("test", "chat-1")
    stream = channel.open_stream(target, "run-1", resumed=False)
    await stream.preview("partial")
    await stream.deliver(0, "answer")
    await stream.discard()

    assert channel.opened == [("run-1", False)]
    assert channel.previews == [("run-1", "partial")]
    assert [s.text for s in channel.sent] == ["answer"]
    assert channel.discarded == ["run-1"]
