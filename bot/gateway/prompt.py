"""The system prompt of one run, from the request and the session's settings.

Its facts (tools, time zone, model, the session's directory) come from the config, the
tool registry and the session's model choice, none of which the agent's prompt builder
(``agent.prompt``) knows; this module gathers them so ``run.py`` only asks for the text.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from agent.prompt import PromptSpec, build_system_prompt
from agent.tools.registry import ToolRegistry
from agent.types import RunRequest
from bot.config import BotdConfig


def system_prompt(
    cfg: BotdConfig, tools: ToolRegistry, req: RunRequest, session_workspace: Path, model_id: str
) -> str:
    """The prompt for ``req``: heartbeats speak in the heartbeat's time zone, the rest in the scheduler's."""
    tz_name = cfg.heartbeat.timezone if req.kind == "heartbeat" else cfg.scheduler.timezone
    spec = PromptSpec(
        mode=req.prompt_mode,
        workspace=cfg.workspace,
        tools={name: (tool.description if (tool := tools.get(name)) else "") for name in tools.names()},
        user_name=req.user_name,
        user_id=req.user_id,
        channel=req.channel,
        now=datetime.now(UTC).astimezone(ZoneInfo(tz_name)),
        timezone=tz_name,
        agent_id=cfg.agent.id,
        model=model_id,
        session_workspace=session_workspace,
    )
    return build_system_prompt(spec)
