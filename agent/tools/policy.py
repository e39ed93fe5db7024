"""Who may run what: tool categories against the run's context.

Interactive runs auto-approve read and write and ask before admin (fail closed when
nobody can be asked). Scheduled runs allow read, and write or admin only when the
job lists it.
"""

from __future__ import annotations

from typing import Any

from agent.tools.registry import ApprovalCallback, Tool
from agent.types import ToolPolicy


async def authorize(
    tool: Tool, args: dict[str, Any], policy: ToolPolicy, approve: ApprovalCallback | None
) -> str | None:
    """Return None when the call may run, else the reason it may not (sent to the model)."""
    category = tool.category
    if category == "read":
        return None
    if policy.context == "scheduled":
        if category in policy.allow:
            return None
        return (
            f"Error: tool {tool.name!r} (category {category}) is not allowed in a scheduled run; "
            f"the job must list '{category}' in its tool policy."
        )
    if category == "write":
        return None
    # admin in an interactive run: a person must approve every call.
    if approve is None:
        return f"Error: tool {tool.name!r} needs approval (category admin) and no approver is available; denied."
    if await approve(tool.name, args):
        return None
    return f"Error: the user denied the call to {tool.name!r}."
