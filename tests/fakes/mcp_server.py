"""A test MCP server on the SDK's MCPServer (formerly FastMCP), speaking the real wire protocol.

    python tests/fakes/mcp_server.py stdio
    python tests/fakes/mcp_server.py http PORT      # streamable HTTP on 127.0.0.1:PORT/mcp
    python tests/fakes/mcp_server.py sse PORT       # SSE on 127.0.0.1:PORT/sse
    python tests/fakes/mcp_server.py fail           # writes a reason to stderr and exits 3
    python tests/fakes/mcp_server.py mute           # runs but never answers
    python tests/fakes/mcp_server.py noisy          # stdio after a line that is not JSON-RPC

``$FAKE_MCP_MARKERS`` (a directory) is where tools leave evidence for the tests:
``touch`` creates a file there, ``slow`` writes ``started-<tag>`` and, when its call is
cancelled, ``cancelled-<tag>``; and every start appends a line to ``starts``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path

import mcp.types as mcp_types
from mcp.server.mcpserver import Context, MCPServer

# A 1x1 transparent PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)

server = MCPServer("fake")


def _markers() -> Path | None:
    where = os.environ.get("FAKE_MCP_MARKERS")
    return Path(where) if where else None


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
async def slow(seconds: float, tag: str = "slow") -> str:
    """Sleep, then answer; leaves markers when it starts and when it is cancelled."""
    markers = _markers()
    if markers is not None:
        (markers / f"started-{tag}").write_text("started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        if markers is not None:
            (markers / f"cancelled-{tag}").write_text("cancelled")
        raise
    return "finished"


@server.tool()
def crash() -> str:
    """End the server process abruptly."""
    os._exit(3)


@server.tool()
def environment() -> str:
    """The server process's environment as JSON."""
    return json.dumps(dict(os.environ))


@server.tool()
def peek(path: str) -> str:
    """Whether ``path`` can be read from inside the server's process: "readable" or why not."""
    try:
        Path(path).read_bytes()
    except OSError as exc:
        return f"unreadable: {type(exc).__name__}"
    return "readable"


@server.tool()
def touch(name: str) -> str:
    """Create a marker file (shows whether a call reached the server)."""
    markers = _markers()
    if markers is None:
        return "no marker directory"
    (markers / Path(name).name).write_text("touched")
    return f"touched {name}"


@server.tool()
def picture() -> list[mcp_types.ContentBlock]:
    """A caption and a PNG image."""
    return [
        mcp_types.TextContent(text="a picture"),
        mcp_types.ImageContent(data=base64.b64encode(PNG).decode(), mime_type="image/png"),
    ]


@server.tool()
def big(size: int) -> str:
    """A text of ``size`` characters."""
    return "x" * size


@server.tool()
def fail() -> str:
    """Raise an error inside the tool."""
    raise ValueError("the fake tool failed on purpose")


@server.tool()
def authorization(ctx: Context) -> str:
    """The Authorization header of the HTTP request (empty on stdio)."""
    headers = ctx.headers or {}
    return headers.get("authorization", "")


@server.tool()
async def grow(ctx: Context) -> str:
    """Add a tool named ``added`` and announce the changed list."""
    server.add_tool(lambda: "added answers", name="added", description="Added while running.")
    await ctx.notify_tools_changed()
    return "grown"


def main(argv: list[str]) -> None:
    mode = argv[1] if len(argv) > 1 else "stdio"
    markers = _markers()
    if markers is not None:
        with (markers / "starts").open("a") as f:
            f.write(f"{os.getpid()}\n")
    if mode == "fail":
        print("fake: cannot start: the configuration is missing", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode == "mute":
        import time

        time.sleep(3600)
    if mode == "noisy":
        print("this line is not JSON-RPC", flush=True)
        mode = "stdio"
    if mode == "stdio":
        server.run("stdio")
    elif mode == "http":
        asyncio.run(server.run_streamable_http_async(host="127.0.0.1", port=int(argv[2])))
    elif mode == "sse":
        asyncio.run(server.run_sse_async(host="127.0.0.1", port=int(argv[2])))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv)
