"""``send_file``: the agent sends a file from the allowed paths to the chat of its run.

The path is checked by the same ``PathGuard`` as the file tools (symlinks resolved,
denied beats allowed), and must be a non-empty regular file. The upload itself is the
daemon's (``ToolContext.send_file``): the agent knows no chat platform, and the daemon
makes sure a retried run does not send the same file twice.
"""

from __future__ import annotations

import asyncio
import os
import stat
from typing import Any

from agent.tools.paths import PathGuard
from agent.tools.registry import Tool, ToolContext, ToolError, ToolOutput

MAX_CAPTION_CHARS = 1024  # Telegram's caption limit; Slack's comment is cut to the same


class SendFileTool(Tool):
    name = "send_file"
    category = "write"
    description = (
        "Send a file (a report you wrote, an image, a CSV...) to the current chat as a file or photo. "
        "The path is relative to the workspace or absolute, within the allowed paths. Optional caption."
    )
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1, "maxLength": 4096, "description": "The file to send."},
            "caption": {
                "type": "string",
                "maxLength": MAX_CAPTION_CHARS,
                "description": "A short text shown with the file.",
            },
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        path = PathGuard.from_settings(ctx.settings).resolve(args["path"])
        try:
            info = await asyncio.to_thread(os.stat, path)
        except FileNotFoundError:
            raise ToolError(f"Error: {args['path']!r} does not exist.") from None
        except OSError as exc:
            raise ToolError(f"Error: cannot read {args['path']!r}: {exc.strerror or exc}.") from None
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"Error: {args['path']!r} is not a regular file.")
        if info.st_size == 0:
            raise ToolError(f"Error: {args['path']!r} is empty; there is nothing to send.")
        if ctx.send_file is None:
            raise ToolError("Error: this run has no chat to send files to.")
        caption = (args.get("caption") or "").strip() or None
        return ToolOutput(await ctx.send_file(path, caption))
