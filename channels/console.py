"""The console channel (``botd chat``): a terminal conversation through the same gateway.

The answer streams as the model writes it (the gateway's sanitized previews, printed as
they grow) and a line shows each tool call starting and ending. Ctrl-C stops the current
run at once; a second one, or one while nothing runs, ends the chat, as do ``/exit``,
``/quit`` and the end of input.

A typed line never waits, and a paste is one message (:mod:`channels.console_input`):
after each read a 0-timeout ``poll`` asks the kernel whether more is readable
(``O_NONBLOCK`` would change the open file the shell and stdout share); messages go
to the gateway in the order they were typed.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import getpass
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TextIO

from agent.types import RunRequest
from channels.base import ChannelContext, ReplyStream, Target
from channels.console_input import InputGatherer

CHAT_ID = "local"
EXIT_WORDS = frozenset({"/exit", "/quit"})
READ_BYTES = 65536
READS_PER_WAKE = 64  # then the event loop gets a turn; the next wake goes on with the burst
BANNER = "botd chat — type a message; /help for commands; /exit, Ctrl-D or Ctrl-C to quit.\n"

EndReason = Literal["eof", "exit", "interrupt"]


class Screen:
    """The terminal's output: knows whether the cursor is mid-line, so lines never run together."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._mid_line = False

    def write(self, text: str) -> None:
        if text:
            self._out.write(text)
            self._out.flush()
            self._mid_line = not text.endswith("\n")

    def end_line(self) -> None:
        if self._mid_line:
            self.write("\n")

    def line(self, text: str) -> None:
        self.end_line()
        self.write(text + "\n")


class ConsoleStream:
    """One run's reply: previews printed as they grow, tool lines, then the rest of the answer."""

    def __init__(self, screen: Screen, on_start: Callable[[], None], on_close: Callable[[], None]) -> None:
        self._screen = screen
        self._on_start = on_start
        self._on_close = on_close
        self._shown = ""  # what this turn's answer has printed so far
        self._state: Literal["new", "started", "closed"] = "new"

    async def start(self) -> None:
        if self._state == "new":
            self._state = "started"
            self._on_start()

    async def preview(self, text: str) -> None:
        # A preview that rewrote what is already on screen (sanitizing a finished tag)
        # cannot be shown on a terminal; the final answer settles it.
        if not text.startswith(self._shown) or text == self._shown:
            return
        if not self._shown:
            self._screen.end_line()
            self._screen.write("bot> ")
        self._screen.write(text[len(self._shown):])
        self._shown = text

    async def tool_started(self, name: str) -> None:
        self._screen.line(f"  … {name} running")
        self._shown = ""

    async def tool_finished(self, name: str, ok: bool, ms: float) -> None:
        self._screen.line(f"  {'✓' if ok else '✗'} {name} {'done' if ok else 'failed'} ({ms / 1000:.1f} s)")

    async def deliver(self, index: int, part: str) -> str | None:
        if index == 0 and self._shown and part.startswith(self._shown):
            self._screen.write(part[len(self._shown):])
            self._screen.end_line()
        else:
            self._screen.line(f"bot> {part}")
        self._shown = ""
        return str(index)

    async def discard(self) -> None:
        self._screen.end_line()
        self._shown = ""

    async def close(self) -> None:
        self._screen.end_line()
        if self._state == "started":
            self._on_close()
        self._state = "closed"


class ConsoleChannel:
    name = "console"

    def __init__(
        self,
        stdin: TextIO | None = None,
        stdout: TextIO | None = None,
        user: str | None = None,
        *,
        catch_interrupt: bool = True,
    ) -> None:
        self._in = stdin or sys.stdin
        self._screen = Screen(stdout or sys.stdout)
        self._user = user or _local_user()
        self._catch_interrupt = catch_interrupt
        self._ctx: ChannelContext | None = None
        self._gatherer = InputGatherer(self._on_message)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._reader_fd: int | None = None
        self._poll = select.poll()
        self._pending: set[asyncio.Task[None]] = set()
        self._last_submit: asyncio.Task[None] | None = None
        self._runs = 0  # replies started and not yet closed
        self._awaiting = False  # a message was accepted and its reply has not started
        self._stopping = False
        self.ended_by: EndReason | None = None
        self.closed = asyncio.Event()

    # ---- lifecycle -----------------------------------------------------------------

    async def start(self, ctx: ChannelContext) -> None:
        self._ctx = ctx
        loop = asyncio.get_running_loop()
        if self._catch_interrupt and threading.current_thread() is threading.main_thread():
            loop.add_signal_handler(signal.SIGINT, self.interrupt)
        try:
            fd = self._in.fileno()
            loop.add_reader(fd, self._on_readable, fd)
            self._reader_fd = fd
            self._poll.register(fd, select.POLLIN)
        except (AttributeError, OSError, ValueError, PermissionError):
            # Not pollable (a regular file, an in-memory stream): a daemon thread reads it,
            # so a read still blocked at exit never keeps the process alive.
            threading.Thread(target=self._read_blocking, args=(loop,), name="console-stdin", daemon=True).start()
        self._screen.write(BANNER)  # last: once it shows, Ctrl-C and input are handled

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        self._stop_reading()
        if self._catch_interrupt and threading.current_thread() is threading.main_thread():
            loop.remove_signal_handler(signal.SIGINT)
        for task in list(self._pending):
            task.cancel()
        self._end("eof")

    async def aclose(self) -> None:
        """The console holds no clients: :meth:`stop` released everything."""

    def is_ready(self) -> bool:
        return self._ctx is not None and not self.closed.is_set()

    # ---- input -----------------------------------------------------------------------

    def _on_readable(self, fd: int) -> None:
        for _ in range(READS_PER_WAKE):
            if self._reader_fd != fd or self.closed.is_set():
                return
            try:
                data = os.read(fd, READ_BYTES)
            except BlockingIOError:
                return  # woken for nothing (someone made the descriptor non-blocking)
            except OSError:
                data = b""
            # An end of input, an error or a hang-up polls as readable too: the next read
            # returns b"" and ends the chat.
            more = bool(data) and bool(self._poll.poll(0))
            self._feed(data, settled=not more)
            if not more:
                return
        # Still readable after many reads (a huge paste, endless input): the next wake goes on.

    def _read_blocking(self, loop: asyncio.AbstractEventLoop) -> None:
        """The thread reader: chunks as large as the source gives at once; a short one
        means nothing more was there to read (what the 0-timeout poll says elsewhere)."""
        read = getattr(getattr(self._in, "buffer", None), "read1", None) or self._read_text
        while True:
            try:
                data = read(READ_BYTES)
            except (OSError, ValueError):
                data = b""
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                loop.call_soon_threadsafe(self._feed, data, len(data) < READ_BYTES)
            if not data:
                return

    def _read_text(self, size: int) -> bytes:
        return self._in.read(size).encode("utf-8", "replace")

    def _feed(self, data: bytes, settled: bool) -> None:
        if self.closed.is_set():
            return
        if not data:
            self._stop_reading()
            self._gatherer.feed(self._decoder.decode(b"", final=True))
            self._gatherer.finish()
            self._end("eof")
            return
        self._gatherer.feed(self._decoder.decode(data))
        if settled:
            self._gatherer.settle()

    def _stop_reading(self) -> None:
        if self._reader_fd is not None:
            asyncio.get_running_loop().remove_reader(self._reader_fd)
            with contextlib.suppress(KeyError, ValueError):
                self._poll.unregister(self._reader_fd)
            self._reader_fd = None

    def _on_message(self, raw: str) -> None:
        text = raw.replace("\r\n", "\n").strip()
        if not text or self.closed.is_set():
            return
        if text.lower() in EXIT_WORDS:
            self._end("exit")
            return
        self._last_submit = self._spawn(self._submit(text, after=self._last_submit))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    async def _submit(self, text: str, after: asyncio.Task[None] | None = None) -> None:
        """``after``: the message typed before, so messages reach the gateway in order (the
        pieces of a paste cut in two must be queued first piece first to fold into one turn)."""
        assert self._ctx is not None
        if after is not None and not after.done():
            await asyncio.wait({after})
        req = RunRequest(session_key=self.session_key(), channel="console", chat_id=CHAT_ID,
                         user_id=self._user, user_name=self._user, text=text)
        result = await self._ctx.submit(req)
        if result.status == "queued":
            self._awaiting = True
        elif result.status == "error":
            self._screen.line(f"(not accepted: {result.detail})")

    def session_key(self) -> str:
        assert self._ctx is not None
        return self._ctx.session_key("dm", self._user)

    # ---- Ctrl-C and the end ------------------------------------------------------------

    def busy(self) -> bool:
        """A reply is being written, or an accepted message has not been answered yet."""
        return self._runs > 0 or self._awaiting

    def interrupt(self) -> None:
        """Ctrl-C: stop the current run (and what is queued); again, or when idle, quit."""
        if self.closed.is_set():
            return
        if self.busy() and not self._stopping:
            self._stopping = True
            self._screen.end_line()
            self._spawn(self._submit("/stopall"))
            return
        self._screen.end_line()
        self._end("interrupt")

    async def stop_runs(self, timeout_s: float = 0.8) -> None:
        """Before leaving: stop the run in progress, so it is neither finished nor retried later."""
        if not self.busy():
            return
        with contextlib.suppress(Exception):
            await self._submit("/stopall")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._runs > 0 and loop.time() < deadline:
            await asyncio.sleep(0.02)

    def _end(self, reason: EndReason) -> None:
        if self.ended_by is None:
            self.ended_by = reason
        self.closed.set()

    def _run_started(self) -> None:
        self._runs += 1
        self._awaiting = False

    def _run_closed(self) -> None:
        self._runs = max(0, self._runs - 1)
        self._awaiting = False
        if self._runs == 0:
            self._stopping = False

    # ---- output ------------------------------------------------------------------------

    def format_parts(self, markdown: str) -> list[str]:
        return [markdown]

    def open_stream(self, target: Target, run_id: str, *, resumed: bool = True) -> ReplyStream:
        return ConsoleStream(self._screen, self._run_started, self._run_closed)

    async def send_text(self, target: Target, text: str) -> str | None:
        self._screen.line(f"bot> {text}")
        return None

    async def ask_approval(self, target: Target, approval_id: str, summary: str) -> None:
        self._screen.line(f"bot> approval needed for {summary}\n     answer /approve {approval_id} or /deny {approval_id}")


def _local_user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "local"
