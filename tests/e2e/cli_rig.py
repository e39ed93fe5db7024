"""Run one ``botd`` command as a real process and collect what it printed."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.botd_process import BOTD, clean_env

# BotFather's shape: digits, a colon, 35 characters (the fake's default token is longer).
TELEGRAM_TOKEN = "123456789:AAFakeTokenForTestsOnly_abcdefghijk"


@dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


async def botd(*args: str, cwd: Path, timeout_s: float = 60.0, answers: str | None = None, **env: str) -> Result:
    """``botd ARGS`` in ``cwd`` with a clean environment (HOME is the test's temporary one);
    ``answers`` are fed to its standard input (it has no terminal)."""
    proc = await asyncio.create_subprocess_exec(
        *BOTD, *args, cwd=str(cwd), env=clean_env(HOME=os.environ["HOME"], **env),
        stdin=asyncio.subprocess.PIPE if answers is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )
    try:
        data = answers.encode() if answers is not None else None
        out, err = await asyncio.wait_for(proc.communicate(data), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"botd {' '.join(args)} did not finish within {timeout_s} s") from None
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


def assert_no_traceback(result: Result) -> None:
    for marker in ("Traceback", "httpx.", "Error: [Errno", "ConnectError"):
        assert marker not in result.text, result.text
