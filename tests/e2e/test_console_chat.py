"""``botd chat`` on a pseudo-terminal against the fake LLM: what a person at the keyboard sees.

The fake LLM serves from its own thread (pexpect's reads block the test's thread), and
botd uses the tests' Redis with a prefix of its own. Every answer is scripted by a marker
word, so a test knows which request is its own.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pexpect
import pytest

from tests.e2e.botd_process import ECHO_TOOLS_YAML, REPO, clean_env, write_config
from tests.fakes.marker_router import Router, last_user_text
from tests.fakes.openai_server import Call, FakeOpenAI, Reply

pytestmark = [pytest.mark.e2e]

TIMEOUT_S = 30


class ThreadedLLM:
    """FakeOpenAI on a private event loop in a daemon thread."""

    def __init__(self) -> None:
        self.router = Router()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-llm", daemon=True)
        self._thread.start()
        self.fake: FakeOpenAI = self._call(FakeOpenAI(responder=self.router).start())

    def _call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(TIMEOUT_S)

    @property
    def base_url(self) -> str:
        return self.fake.base_url

    def user_texts(self) -> list[str]:
        return [last_user_text(body) for body in list(self.fake.requests)]

    def close(self) -> None:
        self._call(self.fake.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(TIMEOUT_S)


@pytest.fixture(scope="module")
def llm() -> Iterator[ThreadedLLM]:
    server = ThreadedLLM()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def chat(llm: ThreadedLLM, redis_url: str, tmp_path: Path) -> Iterator[pexpect.spawn]:
    tools = tmp_path / "tools.yaml"
    tools.write_text(ECHO_TOOLS_YAML, encoding="utf-8")
    config = write_config(tmp_path / "botd.yaml", {
        "agent": {"workspace": str(tmp_path / "ws")},
        "llm": {"base_url": llm.base_url, "api_key": "test-key", "model": "fake"},
        "redis": {"url": redis_url, "prefix": f"chat{uuid.uuid4().hex[:8]}"},
        "security": {"cli_tools_file": str(tools)},
        "queue": {"debounce_ms": 0},
    })
    child = pexpect.spawn(
        sys.executable, ["-m", "bot.cli", "--config", str(config), "chat"],
        cwd=str(tmp_path), env=clean_env(), encoding="utf-8", timeout=TIMEOUT_S, dimensions=(40, 200),
    )
    try:
        child.expect("type a message")
        yield child
    finally:
        if child.isalive():
            child.terminate(force=True)
        child.close()
    assert not (REPO / "workspace").exists()


def marker() -> str:
    return f"mk{uuid.uuid4().hex[:8]}"


def test_answer_streams_as_it_arrives(chat: pexpect.spawn, llm: ThreadedLLM) -> None:
    mark = marker()
    words = " ".join(f"w{i}" for i in range(40))
    llm.router.on(mark, Reply.text(f"alpha {words} omega", chunk_chars=3, chunk_delay_s=0.15))
    chat.sendline(f"tell me {mark}")
    chat.expect("bot> alpha")
    # The start of the answer is on screen while the model is still writing its end.
    chat.expect("w3 ")
    assert "omega" not in chat.before + chat.after
    chat.expect("omega\r\n")
    assert "HTTP Request" not in chat.before and '"event"' not in chat.before


def test_tool_run_shows_a_line_when_it_starts_and_ends(chat: pexpect.spawn, llm: ThreadedLLM) -> None:
    mark = marker()
    llm.router.on(mark, Reply.tool_calls([Call("say", {"text": "hello"})]), Reply.text("the tool said hello"))
    chat.sendline(f"use the tool {mark}")
    chat.expect("say running")
    chat.expect("say done")
    chat.expect("bot> the tool said hello")


def test_ctrl_c_stops_the_run_and_the_chat_goes_on(chat: pexpect.spawn, llm: ThreadedLLM) -> None:
    slow, after = marker(), marker()
    llm.router.on(slow, Reply.text("start " + "x" * 400, chunk_chars=2, chunk_delay_s=0.1))
    llm.router.on(after, Reply.text(f"still here {after}"))
    chat.sendline(f"slow {slow}")
    chat.expect("bot> start")
    chat.sendintr()
    chat.expect("Stopped.")
    chat.sendline(f"next {after}")
    chat.expect(f"bot> still here {after}")
    assert chat.isalive()


def test_ctrl_c_twice_during_a_run_exits(chat: pexpect.spawn, llm: ThreadedLLM) -> None:
    slow = marker()
    llm.router.on(slow, Reply.text("start " + "y" * 400, chunk_chars=2, chunk_delay_s=0.1))
    chat.sendline(f"slow {slow}")
    chat.expect("bot> start")
    chat.sendintr()
    # Two interrupt characters in one burst reach the tty together, and the first one's
    # signal flushes the second from the input queue; a person's presses are further apart.
    time.sleep(0.3)
    chat.sendintr()
    chat.expect(pexpect.EOF, timeout=10)
    chat.close()
    assert chat.exitstatus == 0


def test_ctrl_c_when_idle_exits(chat: pexpect.spawn) -> None:
    chat.sendintr()
    chat.expect(pexpect.EOF, timeout=10)
    chat.close()
    assert chat.exitstatus == 0


@pytest.mark.parametrize("word", ["/exit", "/quit"])
def test_exit_words_leave_without_asking_the_model(chat: pexpect.spawn, llm: ThreadedLLM, word: str) -> None:
    before = len(llm.fake.requests)
    chat.sendline(word)
    chat.expect(pexpect.EOF, timeout=10)
    chat.close()
    assert chat.exitstatus == 0
    assert len(llm.fake.requests) == before


def test_a_pasted_block_of_lines_is_one_message(chat: pexpect.spawn, llm: ThreadedLLM) -> None:
    mark = marker()
    llm.router.on(mark, Reply.text(f"got it {mark}"))
    chat.send(f"first line {mark}\nsecond line\nthird line\n")
    chat.expect(f"bot> got it {mark}")
    mine = [text for text in llm.user_texts() if mark in text]
    assert mine == [f"first line {mark}\nsecond line\nthird line"], json.dumps(mine)
