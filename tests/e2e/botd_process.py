"""Start ``botd`` as a real subprocess against the fakes, for end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml

BOTD = [sys.executable, "-m", "bot.cli"]
REPO = Path(__file__).resolve().parents[2]

# A read tool and an admin tool (which needs approval) for tests that drive tool calls.
ECHO = shutil.which("echo") or "/bin/echo"
ECHO_TOOLS_YAML = f"""
tools:
  - name: say
    description: Print a text.
    category: read
    cmd: {ECHO}
    args: ["{{{{text}}}}"]
    parameters:
      text: {{type: string, maxLength: 200}}
  - name: admin_echo
    description: Print a text (needs approval).
    category: admin
    cmd: {ECHO}
    args: ["admin-says", "{{{{text}}}}"]
    parameters:
      text: {{type: string, maxLength: 200}}
"""



def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without anything that could point botd elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOTD_", "OPENAI_", "TELEGRAM_", "SLACK_"))}
    env.pop("REDIS_URL", None)
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


class BotdProcess:
    def __init__(self, proc: asyncio.subprocess.Process, port: int | None, log_path: Path) -> None:
        self.proc = proc
        self.port = port
        self.log_path = log_path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    async def get(self, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as http, http.get(self.url + path) as resp:
            return resp.status, await resp.text()

    async def wait_healthy(self, timeout_s: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if self.proc.returncode is not None:
                raise AssertionError(f"botd exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                status, _ = await self.get("/healthz")
                if status == 200:
                    return
            await asyncio.sleep(0.1)
        raise AssertionError(f"botd did not become healthy:\n{self.log()[-4000:]}")

    async def terminate(self, timeout_s: float = 30.0) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError(f"botd did not exit on SIGTERM:\n{self.log()[-4000:]}") from None


@contextlib.asynccontextmanager
async def botd_run(config_path: Path, port: int | None, workdir: Path, **env: str) -> AsyncIterator[BotdProcess]:
    log_path = workdir / f"botd-{port}.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *BOTD, "--config", str(config_path), "run",
            cwd=str(workdir), env=clean_env(**env), stdout=log, stderr=log,
        )
    process = BotdProcess(proc, port, log_path)
    try:
        yield process
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
