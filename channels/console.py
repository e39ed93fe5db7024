"""The console channel (``botd chat``): stdin in, stdout out, through the same gateway."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import sys
from typing import TextIO

from agent.types import RunRequest
from channels.base import ChannelContext, ReplyStream, Target

CHAT_ID = "local"


class ConsoleStream:
    """Prints the final answer; previews are not shown on a terminal that cannot edit lines."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    async def start(self) -> None:
        return None

    async def preview(self, text: str) -> None:
        return None

    async def deliver(self, index: int, part: str) -> str | None:
        self._out.write(("" if index else "\n") + f"bot> {part}\n")
        self._out.flush()
        return str(index)

    async def discard(self) -> None:
        return None

    async def close(self) -> None:
        return None


class ConsoleChannel:
    name = "console"

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None, user: str | None = None) -> None:
        self._in = stdin or sys.stdin
        self._out = stdout or sys.stdout
        self._user = user or _local_user()
        self._task: asyncio.Task[None] | None = None
        self._ctx: ChannelContext | None = None
        self.closed = asyncio.Event()

    async def start(self, ctx: ChannelContext) -> None:
        self._ctx = ctx
        self._task = asyncio.create_task(self._read(), name="console-reader")

    async def _read(self) -> None:
        assert self._ctx is not None
        loop = asyncio.get_running_loop()
        self._out.write("botd chat — type a message, /help for commands, Ctrl-D to quit.\n")
        self._out.flush()
        try:
            while True:
                line = await loop.run_in_executor(None, self._in.readline)
                if not line:
                    break
                text = line.strip()
                if not text:
                    continue
                req = RunRequest(
                    session_key=self._ctx.session_key("dm", self._user),
                    channel="console",
                    chat_id=CHAT_ID,
                    user_id=self._user,
                    user_name=self._user,
                    text=text,
                )
                result = await self._ctx.submit(req)
                if result.status == "error":
                    self._out.write(f"(not accepted: {result.detail})\n")
                    self._out.flush()
        finally:
            self.closed.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def aclose(self) -> None:
        """The console holds no clients: :meth:`stop` released everything."""

    def is_ready(self) -> bool:
        return self._task is not None and not self._task.done()

    def format_parts(self, markdown: str) -> list[str]:
        return [markdown]

    def open_stream(self, target: Target, run_id: str) -> ReplyStream:
        return ConsoleStream(self._out)

    async def send_text(self, target: Target, text: str) -> str | None:
        self._out.write(f"bot> {text}\n")
        self._out.flush()
        return None

    async def ask_approval(self, target: Target, approval_id: str, summary: str) -> None:
        self._out.write(f"bot> approval needed for {summary}\n     answer /approve {approval_id} or /deny {approval_id}\n")
        self._out.flush()


def _local_user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "local"
