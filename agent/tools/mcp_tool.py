"""An MCP server's tool as a botd tool, and its result as text for the model.

The model sees ``<server>__<tool>`` with the server's own input schema (the
registry validates arguments against it like any built-in's) and a description
that starts with the server's name. Results: text passes through; images,
audio and binary resources are written to ``mcp/`` under the run's workspace
and the model gets one line naming the file (so ``send_file`` can forward it);
the whole text is capped like bash output. File names are botd's own — a
server never chooses a path.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import mimetypes
import re
import uuid
from pathlib import Path
from typing import Any

import mcp.types as mcp_types
from mcp import MCPError

from agent.tools.mcp_connection import McpConnection, McpUnavailable
from agent.tools.process import CappedBuffer
from agent.tools.registry import Tool, ToolContext, ToolError, ToolOutput

MAX_DESCRIPTION_CHARS = 2000
MAX_FILE_BYTES = 20 * 1024 * 1024
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")


def public_name(server: str, tool: str) -> str:
    """``<server>__<tool>`` within the 64 characters of ``[A-Za-z0-9_-]`` function names allow."""
    return f"{server}__{_UNSAFE_NAME.sub('_', tool)}"[:64]


def input_schema(tool: mcp_types.Tool) -> dict[str, Any]:
    """The server's schema, made an object schema if the server left that implicit."""
    schema = dict(tool.input_schema) if isinstance(tool.input_schema, dict) else {}
    schema.setdefault("type", "object")
    if schema["type"] == "object":
        schema.setdefault("properties", {})
    return schema


class McpTool(Tool):
    """Calls one tool of one MCP server through its connection."""

    def __init__(self, connection: McpConnection, remote: mcp_types.Tool) -> None:
        spec = connection.spec
        self.connection = connection
        self.remote_name = remote.name
        self.name = public_name(spec.name, remote.name)
        text = (remote.description or remote.title or remote.name).strip()
        self.description = f"[MCP server {spec.name}] {text}"[:MAX_DESCRIPTION_CHARS]
        self.parameters = input_schema(remote)
        self.category = spec.category_of(remote.name)

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        server = self.connection.spec.name
        try:
            result = await self.connection.call(self.remote_name, args)
        except McpUnavailable as exc:
            raise ToolError(str(exc)) from None
        except TimeoutError:
            raise ToolError(
                f"Error: {self.name!r} timed out after {self.connection.spec.timeout_s:g} s; the call was cancelled."
            ) from None
        except MCPError as exc:
            raise ToolError(f"Error: MCP server {server!r} refused the call: {_first_line(str(exc))}") from None
        # Decoding and writing up to MAX_FILE_BYTES per block would stall the event loop.
        text = await asyncio.to_thread(
            render_result, result, ctx.settings.workspace / "mcp" / server, ctx.settings.max_output_bytes
        )
        return ToolOutput(text, is_error=bool(result.is_error))


def render_result(result: mcp_types.CallToolResult, files_dir: Path, max_bytes: int) -> str:
    """The result's content blocks as text (files for binary data), capped at ``max_bytes``."""
    parts = [_render_block(block, files_dir) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts) if parts else "(no output)"
    buffer = CappedBuffer(max(2, max_bytes))
    buffer.write(text.encode("utf-8", errors="replace"))
    return buffer.render(max_bytes)


def _render_block(block: Any, files_dir: Path) -> str:
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        return _save(block.type, block.data, block.mime_type, files_dir)
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        mime = resource.mime_type or "application/octet-stream"
        if isinstance(resource, mcp_types.TextResourceContents):
            return f"[resource {resource.uri} ({resource.mime_type or 'text/plain'})]\n{resource.text}"
        return _save(f"resource {resource.uri}", resource.blob, mime, files_dir)
    if isinstance(block, mcp_types.ResourceLink):
        details = ", ".join(x for x in (block.mime_type, block.description) if x)
        return f"[resource link: {block.uri} {block.name}" + (f" ({details})" if details else "") + "]"
    return f"[unsupported content block: {getattr(block, 'type', type(block).__name__)}]"


def _save(kind: str, data: str, mime: str, files_dir: Path) -> str:
    """Decode base64 ``data`` into a new file; the line the model gets names it."""
    if len(data) * 3 // 4 > MAX_FILE_BYTES:
        return f"[{kind} ({mime}) omitted: over {MAX_FILE_BYTES} bytes]"
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return f"[{kind} ({mime}): the server sent data that is not valid base64]"
    extension = mimetypes.guess_extension(mime.split(";")[0].strip()) or ".bin"
    try:
        files_dir.mkdir(parents=True, exist_ok=True)
        path = files_dir / f"{uuid.uuid4().hex}{extension}"
        path.write_bytes(raw)
    except OSError as exc:
        return f"[{kind} ({mime}, {len(raw)} bytes) could not be saved: {exc.strerror or exc}]"
    return f"[{kind}: {path.resolve()} ({mime}, {len(raw)} bytes)]"


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0][:300] if lines else "no reason given"
