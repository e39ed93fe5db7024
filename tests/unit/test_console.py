"""The console's pieces without a terminal: what arrives on stdin becomes messages (a lone
line at once, lines readable together as one), streamed previews print only what is new,
tool lines, and the busy state Ctrl-C acts on."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import pty
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from agent.types import RunRequest
from bot.session_keys import session_key
from channels.base import ChannelContext, Scope, SubmitResult
from channels.console import ConsoleChannel, ConsoleStream, Screen
from channels.console_input import MAX_MESSAGE_CHARS, PASTE_END, PASTE_START, InputGatherer

# ---- the gatherer: when lines go out --------------------------------------------------


class Collected:
    """An ``emit`` that records messages and lets a test await the next one."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self._more = asyncio.Event()

    def __call__(self, text: str) -> None:
        self.messages.append(text)
        self._more.set()

    async def wait(self, n: int) -> list[str]:
        while len(self.messages) < n:
            self._more.clear()
            await asyncio.wait_for(self._more.wait(), 10)
        return self.messages


async def test_a_lone_line_goes_out_as_soon_as_nothing_more_is_readable() -> None:
    out = Collected()
    gatherer = InputGatherer(out)
    gatherer.feed("hello\n")
    assert out.messages == []  # more of the same read may follow
    gatherer.settle()
    assert out.messages == ["hello"]  # at once: no timer, no turn of the event loop
    assert not gatherer.waiting


async def test_lines_read_together_are_one_message() -> None:
    out = Collected()
    gatherer = InputGatherer(out)
    for line in ("one\n", "two\n", "three\n"):  # a terminal's paste: one line per read
        gatherer.feed(line)
    gatherer.settle()
    assert out.messages == ["one\ntwo\nthree"]


async def test_lines_settled_apart_are_separate_messages() -> None:
    out = Collected()
    gatherer = InputGatherer(out)
    gatherer.feed("one\n")
    gatherer.settle()
    gatherer.feed("two\r\n")
    gatherer.settle()
    assert out.messages == ["one", "two\r"]  # the channel strips what a CRLF leaves


async def test_a_line_still_being_typed_waits_for_enter() -> None:
    out = Collected()
    gatherer = InputGatherer(out)
    gatherer.feed("half a li")
    gatherer.settle()
    assert out.messages == [] and not gatherer.waiting
    gatherer.feed("ne\n")
    gatherer.settle()
    gatherer.feed("next")
    gatherer.settle()
    assert out.messages == ["half a line"]
    gatherer.finish()  # end of input: the unfinished line is sent too
    assert out.messages == ["half a line", "next"]


async def test_input_stopping_mid_line_waits_for_the_rest_of_the_chunk() -> None:
    out = Collected()
    gatherer = InputGatherer(out)
    gatherer.feed("one\ntw")  # a chunk boundary: a typed line always ends in Enter
    gatherer.settle()
    assert out.messages == [] and gatherer.waiting
    gatherer.feed("o\n")
    gatherer.settle()
    assert out.messages == ["one\ntwo"]


async def test_a_line_cut_mid_way_lets_the_complete_lines_go_after_the_grace() -> None:
    out = Collected()
    gatherer = InputGatherer(out, grace_s=0.001)
    gatherer.feed("one\ntw")
    gatherer.settle()
    assert await out.wait(1) == ["one"]
    gatherer.feed("o\n")
    gatherer.settle()
    assert out.messages == ["one", "two"]


async def test_a_big_burst_waits_for_its_next_piece() -> None:
    out = Collected()
    gatherer = InputGatherer(out, grace_s=0.001)
    block = "".join(f"line {i}\n" for i in range(1000))  # more than a terminal's line buffer
    gatherer.feed(block)
    gatherer.settle()
    assert out.messages == [] and gatherer.waiting
    gatherer.feed("the rest\n")
    gatherer.settle()
    assert await out.wait(1) == [block + "the rest"]
    gatherer.feed("a lone line after it\n")  # the burst is over: no grace for this one
    gatherer.settle()
    assert out.messages[1:] == ["a lone line after it"]


async def test_a_bracketed_paste_is_one_message_however_slowly_it_comes() -> None:
    out = Collected()
    gatherer = InputGatherer(out)
    for piece in (PASTE_START + "a\n", "b\n", "c" + PASTE_END + "\n"):
        gatherer.feed(piece)
        gatherer.settle()
    assert out.messages == ["a\nb\nc"]


async def test_a_paste_marker_cut_by_a_read_boundary_is_still_a_marker() -> None:
    out = Collected()
    gatherer = InputGatherer(out)
    for piece in ("\x1b[2", "00~a\n", "b\n", "c\x1b[20", "1~\n"):
        gatherer.feed(piece)
        gatherer.settle()
    assert out.messages == ["a\nb\nc"]
    gatherer.feed("up\x1b")  # an escape that turns out not to be a marker is kept
    gatherer.settle()
    gatherer.feed("[A\n")
    gatherer.settle()
    assert out.messages[1:] == ["up\x1b[A"]


async def test_a_finished_paste_waits_whole_for_enter() -> None:
    out = Collected()
    gatherer = InputGatherer(out, grace_s=0.001)
    gatherer.feed(PASTE_START + "a\nb" + PASTE_END)
    gatherer.settle()
    assert out.messages == [] and not gatherer.waiting  # not even its first line
    gatherer.feed("\n")
    gatherer.settle()
    assert out.messages == ["a\nb"]


async def test_a_paste_never_closed_goes_out_at_the_end_of_input() -> None:
    out = Collected()
    gatherer = InputGatherer(out)
    gatherer.feed(PASTE_START + "a\nb\n\x1b[20")
    gatherer.settle()
    assert out.messages == []
    gatherer.finish()
    assert out.messages == ["a\nb\n\x1b[20"]


async def test_endless_input_is_cut_into_bounded_messages() -> None:
    out = Collected()
    gatherer = InputGatherer(out)
    chunk = "x" * 65536  # no newline, ever
    for _ in range(MAX_MESSAGE_CHARS // len(chunk) + 1):
        gatherer.feed(chunk)
        gatherer.settle()
    assert [len(m) for m in out.messages] == [MAX_MESSAGE_CHARS]
    gatherer.finish()
    assert [len(m) for m in out.messages] == [MAX_MESSAGE_CHARS, len(chunk)]


# ---- the channel on a real descriptor ---------------------------------------------------


class Submissions:
    """The daemon's side of the console: records what is submitted; ``hold`` makes the
    next submission wait until released."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.started: list[str] = []
        self.more = asyncio.Event()
        self.hold: asyncio.Event | None = None

    async def submit(self, req: RunRequest) -> SubmitResult:
        self.started.append(req.text)
        hold, self.hold = self.hold, None
        if hold is not None:
            await hold.wait()
        self.texts.append(req.text)
        self.more.set()
        return SubmitResult("queued")

    async def wait(self, n: int) -> list[str]:
        while len(self.texts) < n:
            self.more.clear()
            await asyncio.wait_for(self.more.wait(), 10)
        return self.texts

    def context(self) -> ChannelContext:
        return ChannelContext(
            submit=self.submit, session_key=self.session_key, kv=cast(Any, None),
            add_route=lambda *_: None, replica_id="test",
        )

    def session_key(self, scope: Scope, chat_id: str, *, thread: str | None = None, topic: str | None = None) -> str:
        return session_key("main", "console", scope, chat_id, thread=thread, topic=topic)


@contextlib.asynccontextmanager
async def console_on(read_fd: int) -> AsyncIterator[tuple[ConsoleChannel, Submissions]]:
    subs = Submissions()
    console = ConsoleChannel(os.fdopen(read_fd, "r", closefd=False), io.StringIO(), "tester", catch_interrupt=False)
    await console.start(subs.context())
    try:
        yield console, subs
    finally:
        await console.stop()


@contextlib.contextmanager
def pipe() -> Any:
    r, w = os.pipe()
    try:
        yield r, w
    finally:
        for fd in (r, w):
            with contextlib.suppress(OSError):
                os.close(fd)


async def test_a_lone_line_is_submitted_in_the_wake_that_read_it() -> None:
    with pipe() as (r, w):
        async with console_on(r) as (console, subs):
            os.write(w, b"hello\n")
            console._on_readable(r)  # the wake epoll would make
            await asyncio.sleep(0)  # one turn of the loop: the submitting task runs
            assert subs.texts == ["hello"]


async def test_lines_written_together_are_one_message() -> None:
    with pipe() as (r, w):
        async with console_on(r) as (_, subs):
            os.write(w, b"first\nsecond\nthird\n")
            assert await subs.wait(1) == ["first\nsecond\nthird"]
            os.write(w, b"later\n")
            assert await subs.wait(2) == ["first\nsecond\nthird", "later"]


async def test_a_terminal_paste_read_line_by_line_is_one_message() -> None:
    main, tty = pty.openpty()
    try:
        async with console_on(tty) as (_, subs):
            os.write(main, b"first\nsecond\nthird\n")  # canonical mode: one line per read
            assert await subs.wait(1) == ["first\nsecond\nthird"]
            os.write(main, PASTE_START.encode() + b"pasted\rlines" + PASTE_END.encode() + b"\n")
            assert await subs.wait(2) == ["first\nsecond\nthird", "pasted\nlines"]
    finally:
        os.close(main)
        os.close(tty)


async def test_messages_reach_the_gateway_in_the_order_they_were_typed() -> None:
    with pipe() as (r, w):
        async with console_on(r) as (console, subs):
            subs.hold = release = asyncio.Event()
            os.write(w, b"part one\n")
            console._on_readable(r)
            await asyncio.sleep(0)
            assert subs.started == ["part one"]  # and its submission is not done yet
            os.write(w, b"part two\n")
            console._on_readable(r)
            for _ in range(5):  # unordered, the second would be submitted in the first turn
                await asyncio.sleep(0)
            assert subs.started == ["part one"]
            release.set()
            assert await subs.wait(2) == ["part one", "part two"]


async def test_odd_bytes_and_a_last_line_without_enter_at_the_end_of_input() -> None:
    with pipe() as (r, w):
        async with console_on(r) as (console, subs):
            os.write(w, b"caf\xc3")  # a character cut by the read boundary
            os.write(w, b"\xa9 \xff\xfe\x00 ok\n")
            assert await subs.wait(1) == ["café \ufffd\ufffd\x00 ok"]
            os.write(w, b"no enter")
            os.close(w)  # Ctrl-D on an empty line, or the pipe's end
            assert await subs.wait(2) == ["café \ufffd\ufffd\x00 ok", "no enter"]
            await asyncio.wait_for(console.closed.wait(), 10)
            assert console.ended_by == "eof"


async def test_a_huge_paste_arrives_whole_and_in_order() -> None:
    text = "".join(f"{i:06d} " + "y" * 90 + "\n" for i in range(4000))  # ~390 KB, 6 pipe buffers
    with pipe() as (r, w):
        async with console_on(r) as (console, subs):
            writer = threading.Thread(target=_write_all, args=(w, text.encode()))
            writer.start()
            await asyncio.to_thread(writer.join)
            os.close(w)
            await asyncio.wait_for(console.closed.wait(), 30)
            await _settled(lambda: len("\n".join(subs.texts)) >= len(text) - 1)
            assert "\n".join(subs.texts) == text.rstrip("\n")


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


async def _settled(check: Callable[[], bool]) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("not settled")


async def test_a_file_on_stdin_is_read_by_a_thread_all_at_once() -> None:
    subs = Submissions()
    console = ConsoleChannel(io.StringIO("one\ntwo\n"), io.StringIO(), "tester", catch_interrupt=False)
    await console.start(subs.context())
    await asyncio.wait_for(console.closed.wait(), 10)
    assert await subs.wait(1) == ["one\ntwo"]
    await console.stop()


# ---- output -----------------------------------------------------------------------------


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
