"""The ``bash`` tool: run a command line in the workspace.

Before anything runs, the whole line goes through the blocklist
(``command_guard``); a refused line runs nothing. The command then runs with
``bash -c`` inside the tool sandbox (``agent.tools.sandbox``: bubblewrap, the
workspace the only writable place, botd's files masked, per-call limits), with
only the allowlisted environment (no API keys or chat tokens), stdin closed, a
timeout that ends the whole sandbox, and an output cap. The blocklist is defence
in depth; the sandbox is what holds. With the sandbox off, the command has the
rights of botd's user.
"""

from __future__ import annotations

import shutil
from typing import Any

from agent.tools.command_guard import check_command
from agent.tools.environment import subprocess_env
from agent.tools.process import run_sandboxed
from agent.tools.registry import Tool, ToolContext, ToolError, ToolOutput, ToolSettings


class BashTool(Tool):
    name = "bash"
    category = "write"

    def __init__(self, settings: ToolSettings) -> None:
        self.description = (
            "Run a bash command line in the workspace directory and return its output, stderr and exit "
            f"code. Times out after {settings.timeout_s:g} s (the command and everything it started are "
            f"killed); output beyond {settings.max_output_bytes} bytes is cut. No stdin, no interactive "
            "programs. Destructive and privileged commands (rm, sudo, dd, mkfs, chmod 777, curl | sh, …) "
            "are refused; use write_file to create or change files."
        )
        self.parameters = {
            "type": "object",
            "properties": {
                "command": {"type": "string", "minLength": 1, "description": "The bash command line to run."},
                "timeout_s": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": settings.timeout_s,
                    "description": f"Shorter timeout in seconds (at most {settings.timeout_s:g}).",
                },
            },
            "required": ["command"],
            "additionalProperties": False,
        }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        command: str = args["command"]
        check_command(command)  # raises BlockedCommandError: nothing runs
        settings = ctx.settings
        timeout = min(float(args.get("timeout_s", settings.timeout_s)), settings.timeout_s)
        env = subprocess_env(settings.env_allowlist)
        bash = shutil.which("bash", path=env.get("PATH")) or shutil.which("bash")
        if bash is None:
            raise ToolError("Error: bash is not installed on this machine.")
        try:
            result = await run_sandboxed(
                [bash, "--noprofile", "--norc", "-c", command], settings=settings, env=env, timeout_s=timeout
            )
        except OSError as exc:
            raise ToolError(f"Error: could not start bash: {exc.strerror or exc}.") from None
        return ToolOutput(result.render(), is_error=not result.ok)
