"""The console through the real gateway: a paste that reaches it in two pieces (a slow
writer, a cut the reader could not see coming) is still one turn, because the second
piece folds into the run the first started while that run has shown nothing."""

from __future__ import annotations

import io
import os
from pathlib import Path

from bot.daemon import Daemon
from channels.console import ConsoleChannel
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.integration.gateway_harness import Gate, make_config, request_texts, wait_until


async def test_a_paste_cut_in_two_reads_is_still_one_turn(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    gate = Gate()
    r, w = os.pipe()
    out = io.StringIO()
    try:
        async with FakeOpenAI(responder=gate) as fake:
            cfg = make_config(tmp_path, fake, redis_url, redis_prefix, queue={"debounce_ms": 60000})
            console = ConsoleChannel(os.fdopen(r, "r", closefd=False), out, "tester", catch_interrupt=False)
            daemon = Daemon(cfg, channels={"console": console}, with_http=False, with_scheduler=False)
            await daemon.start()
            try:
                os.write(w, b"first half of the paste\n")
                await gate.wait_waiting(1)  # a message of its own: the model already has it
                os.write(w, b"second half\n")
                await gate.wait_hung_up(1)  # that call was dropped before it showed anything
                await gate.wait_waiting(1)
                gate.replies.append(Reply.text("read both halves"))
                gate.release()
                await wait_until(lambda: "bot> read both halves" in out.getvalue(), what="the answer")
                assert request_texts(fake.requests[-1]) == ["first half of the paste", "second half"]
                assert out.getvalue().count("bot>") == 1
            finally:
                await daemon.stop()  # stops the console too
    finally:
        os.close(r)
        os.close(w)

