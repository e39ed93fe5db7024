"""The console's pieces without a terminal: pastes become one message, streamed previews
print only what is new, tool lines, and the busy state Ctrl-C acts on."""

from __future__ import annotations

import asyncio
import io

from channels.console import PASTE_END, PASTE_START, ConsoleStream, PasteGatherer, Screen


async def gathered(*pieces: str, gap_s: float = 0.0, window_s: float = 0.05) -> list[str]:
    out: list[str] = []
    gatherer = PasteGatherer(out.append, window_s=window_s)
    for piece in pieces:
        gatherer.feed(piece)
        if gap_s:
            await asyncio.sleep(gap_s)
    await asyncio.sleep(window_s * 3)
    gatherer.finish()
    return out


async def test_lines_arriving_together_are_one_message() -> None:
    assert await gathered("one\n", "two\n", "three\n") == ["one\ntwo\nthree"]


async def test_lines_typed_apart_are_separate_messages() -> None:
    assert await gathered("one\n", "two\n", gap_s=0.2) == ["one", "two"]


async def test_a_line_still_being_typed_waits_for_enter() -> None:
    out: list[str] = []
    gatherer = PasteGatherer(out.append, window_s=0.01)
    gatherer.feed("half a li")
    await asyncio.sleep(0.05)
    assert out == []
    gatherer.feed("ne\nnext")
    await asyncio.sleep(0.05)
    assert out == ["half a line"]
    gatherer.finish()  # end of input: the unfinished line is sent too
    assert out == ["half a line", "next"]


async def test_a_bracketed_paste_is_one_message_however_slow() -> None:
    pieces = (PASTE_START + "a\n", "b\n", "c" + PASTE_END + "\n")
    assert await gathered(*pieces, gap_s=0.1, window_s=0.02) == ["a\nb\nc"]


async def test_stream_prints_only_what_is_new_and_a_line_per_tool() -> None:
    out = io.StringIO()
    events: list[str] = []
    stream = ConsoleStream(Screen(out), lambda: events.append("start"), lambda: events.append("close"))
    await stream.start()
    await stream.preview("Let me")
    await stream.preview("Let me check")
    await stream.tool_started("bash")
    await stream.tool_finished("bash", True, 1234.0)
    await stream.preview("It is")
    await stream.preview("It was rewritten")  # not a continuation: left for the final text
    await stream.deliver(0, "It is sunny.")
    await stream.close()
    await stream.close()
    assert out.getvalue() == (
        "bot> Let me check\n  … bash running\n  ✓ bash done (1.2 s)\nbot> It is sunny.\n"
    )
    assert events == ["start", "close"]


async def test_a_final_text_unlike_the_preview_is_printed_whole() -> None:
    out = io.StringIO()
    stream = ConsoleStream(Screen(out), lambda: None, lambda: None)
    await stream.preview("draft")
    await stream.deliver(0, "Final.")
    assert out.getvalue() == "bot> draft\nbot> Final.\n"


async def test_a_stream_never_started_does_not_count_as_a_run() -> None:
    events: list[str] = []
    stream = ConsoleStream(Screen(io.StringIO()), lambda: events.append("start"), lambda: events.append("close"))
    await stream.discard()
    await stream.close()
    assert events == []
