"""MCP without a server: config to specs, result rendering, tool naming and registry sync."""

from __future__ import annotations

import base64
from pathlib import Path

import mcp.types as mcp_types
import pytest

from agent.tools.mcp import McpManager
from agent.tools.mcp_spec import McpServerSpec
from agent.tools.mcp_tool import MAX_FILE_BYTES, input_schema, public_name, render_result
from agent.tools.registry import ToolRegistry
from bot.config import BotdConfig, ConfigError, load_config
from bot.mcp_servers import server_specs


def config(servers: dict[str, object]) -> BotdConfig:
    return BotdConfig(mcp={"servers": servers})  # type: ignore[arg-type]


def test_specs_take_env_and_header_references_from_the_daemon_environment() -> None:
    cfg = config({
        "gh": {"command": "github-mcp", "args": ["--stdio"], "env": {"TOKEN": "${GH_TOKEN}", "MODE": "ro"},
               "category": "read", "tools": {"delete_repo": {"category": "admin"}},
               "disabled_tools": ["fork"]},
        "web": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${WEB_KEY}"},
                "enabled_tools": ["search"], "timeout_s": 5},
        "off": {"command": "x", "enabled": False},
    })
    gh, web = server_specs(cfg, environ={"GH_TOKEN": "ghp_abc", "WEB_KEY": "k1"})
    assert (gh.transport, gh.command, gh.args) == ("stdio", "github-mcp", ("--stdio",))
    assert dict(gh.env) == {"TOKEN": "ghp_abc", "MODE": "ro"}
    assert gh.category_of("list_repos") == "read" and gh.category_of("delete_repo") == "admin"
    assert not gh.offers("fork") and gh.offers("list_repos")
    assert (web.transport, dict(web.headers), web.timeout_s) == ("streamable_http", {"Authorization": "Bearer k1"}, 5)
    assert web.offers("search") and not web.offers("delete")


def test_an_unset_reference_is_a_config_error_naming_the_key() -> None:
    cfg = config({"gh": {"command": "github-mcp", "env": {"TOKEN": "${GH_TOKEN}"}}})
    with pytest.raises(ConfigError, match=r"mcp\.servers\.gh\.env\.TOKEN: environment variable GH_TOKEN is not set"):
        server_specs(cfg, environ={})


@pytest.mark.parametrize(
    ("server", "problem"),
    [
        ({"command": "a", "url": "http://x/mcp"}, "exactly one of command"),
        ({}, "exactly one of command"),
        ({"url": "file:///etc/passwd"}, "url must start with http"),
        ({"command": "a", "timeout_s": 0}, "greater than 0"),
        ({"command": "a", "category": "root"}, "mcp.servers.s.category"),
    ],
)
def test_bad_server_entries_name_the_key(tmp_path: Path, server: dict[str, object], problem: str) -> None:
    path = tmp_path / "botd.yaml"
    path.write_text(__import__("yaml").safe_dump({"mcp": {"servers": {"s": server}}}))
    with pytest.raises(ConfigError, match=r"mcp\.servers") as error:
        load_config(path)
    assert problem in str(error.value)


@pytest.mark.parametrize("name", ["a__b", "_a", "a b", "x" * 33, "a.b"])
def test_server_names_cannot_break_the_tool_prefix(tmp_path: Path, name: str) -> None:
    path = tmp_path / "botd.yaml"
    path.write_text(__import__("yaml").safe_dump({"mcp": {"servers": {name: {"command": "a"}}}}))
    with pytest.raises(ConfigError, match="server name"):
        load_config(path)


def test_public_names_fit_function_name_rules() -> None:
    assert public_name("gh", "list.repos/v2") == "gh__list_repos_v2"
    assert len(public_name("server", "t" * 200)) == 64


def test_a_schema_without_type_becomes_an_object_schema() -> None:
    tool = mcp_types.Tool(name="t", input_schema={})
    assert input_schema(tool) == {"type": "object", "properties": {}}


def result(*blocks: object, structured: object = None, is_error: bool = False) -> mcp_types.CallToolResult:
    return mcp_types.CallToolResult(content=list(blocks), structured_content=structured, is_error=is_error)  # type: ignore[arg-type]


def test_binary_content_becomes_files_and_hostile_data_becomes_notices(tmp_path: Path) -> None:
    good = base64.b64encode(b"RIFF....WAVE").decode()
    text = render_result(
        result(
            mcp_types.AudioContent(data=good, mime_type="audio/wav"),
            mcp_types.ImageContent(data="not base64!!", mime_type="image/png"),
            mcp_types.ImageContent(data="A" * (MAX_FILE_BYTES * 2), mime_type="image/png"),
            mcp_types.EmbeddedResource(
                resource=mcp_types.TextResourceContents(uri="file:///r.txt", text="inline text", mime_type="text/plain")
            ),
            mcp_types.EmbeddedResource(
                resource=mcp_types.BlobResourceContents(uri="file:///../../etc/x", blob=good, mime_type=None)
            ),
            mcp_types.ResourceLink(uri="https://x/doc", name="doc", mime_type="text/html"),
        ),
        tmp_path / "mcp" / "s",
        1_000_000,
    )
    lines = text.splitlines()
    assert lines[0].startswith("[audio: ") and "(audio/wav, 12 bytes)]" in lines[0]
    assert "not valid base64" in lines[1]
    assert "omitted: over" in lines[2]
    assert lines[3] == "[resource file:///r.txt (text/plain)]" and lines[4] == "inline text"
    assert lines[5].startswith("[resource file:///../../etc/x: ") and "(application/octet-stream, 12 bytes)]" in lines[5]
    assert lines[6] == "[resource link: https://x/doc doc (text/html)]"
    saved = sorted(p.name for p in (tmp_path / "mcp" / "s").iterdir())
    assert len(saved) == 2 and all(len(name.split(".")[0]) == 32 for name in saved)  # botd's names only
    assert not (tmp_path / "etc").exists()


def test_structured_content_is_used_when_there_is_no_text_and_output_is_capped(tmp_path: Path) -> None:
    assert render_result(result(structured={"a": 1}), tmp_path, 1000) == '{"a": 1}'
    assert render_result(result(), tmp_path, 1000) == "(no output)"
    capped = render_result(result(mcp_types.TextContent(text="y" * 10_000)), tmp_path, 2048)
    assert "[output truncated: " in capped and len(capped) < 2200


def test_tools_the_registry_refuses_are_skipped_and_reported(tmp_path: Path) -> None:
    spec = McpServerSpec(name="s", transport="stdio", command="unused")
    manager = McpManager([spec], ToolRegistry(), cwd=tmp_path, env_allowlist=())
    connection = manager.connections["s"]
    tools = [
        mcp_types.Tool(name="ok", input_schema={"type": "object", "properties": {"x": {"type": "integer"}}}),
        mcp_types.Tool(name="bad_schema", input_schema={"type": "object", "properties": {"x": {"type": 5}}}),
        mcp_types.Tool(name="o.k", input_schema={"type": "object"}),  # sanitizes to s__o_k
        mcp_types.Tool(name="o_k", input_schema={"type": "object"}),  # collides with it
    ]
    manager._sync(connection, tools)
    assert manager.registry.names() == ["s__ok", "s__o_k"]
    status = manager.snapshot()[0]
    assert status.tools == 2 and len(status.skipped_tools) == 2
    assert status.skipped_tools[0].startswith("bad_schema: ") and "registered twice" in status.skipped_tools[1]
    # A new list replaces the old one entirely.
    manager._sync(connection, tools[:1])
    assert manager.registry.names() == ["s__ok"] and manager.snapshot()[0].skipped_tools == ()
