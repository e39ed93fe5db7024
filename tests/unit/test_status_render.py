"""``botd status`` prints what daemons wrote into the store: shown as plain single lines."""

from __future__ import annotations

from typing import Any

from bot.config import BotdConfig
from bot.status import channel_config, mcp_config, render, sandbox_state


def report(cfg: BotdConfig, daemons: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "version": "0", "store": {"ok": True}, "channels": channel_config(cfg), "sandbox": sandbox_state(cfg),
        "mcp": mcp_config(cfg), "daemons": daemons, "sessions": 0, "waiting_sessions": 0,
        "queued_messages": 0, "active_runs": 0, "cron_jobs": 0, "next_cron": [],
    }


def test_a_hostile_mcp_error_cannot_drive_the_terminal() -> None:
    cfg = BotdConfig()
    daemon = {"replica": "r1", "started_at": 0, "seen_at": 0, "sandbox": "OFF: x\x1b]0;owned\x07",
              "mcp": [{"name": "evil", "state": "restarting", "tools": 0, "restarts": 3,
                       "last_error": "boom\x1b[2J\x1b[31mred\nsecond line" + "x" * 1000}, "not a server"]}
    text = render(cfg, report(cfg, [daemon]), now=0)
    assert "\x1b" not in text and "\x07" not in text
    [line] = [ln for ln in text.splitlines() if ln.startswith("    mcp evil:")]
    assert "restarting, 0 tools, 3 restarts, last error: boom" in line and "second line" in line
    assert len(line) < 500


def test_an_older_daemon_without_the_fields_still_renders() -> None:
    cfg = BotdConfig()
    text = render(cfg, report(cfg, [{"replica": "r1", "started_at": 0, "seen_at": 0}]), now=0)
    assert "    sandbox: not reported" in text and "sandbox: security.sandbox auto (each daemon's state above)" in text
