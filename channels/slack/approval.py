"""Block Kit for tool approvals: the prompt with Approve/Deny buttons and the decided state.

Button ``action_id`` is ``botd_approve`` / ``botd_deny`` and ``value`` the approval id;
once someone answers, the buttons are replaced by who decided what, so a prompt can
only be answered from the chat once.
"""

from __future__ import annotations

from typing import Any, Literal

from channels.slack.commands import APPROVE_ACTION, DENY_ACTION
from channels.slack.mrkdwn import escape_text

SECTION_LIMIT = 2900  # Slack allows 3000 characters in a section's text


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def approval_prompt(approval_id: str, summary: str) -> tuple[str, list[dict[str, Any]]]:
    """(fallback text, blocks) of the approval prompt."""
    body = escape_text(_clip(summary, SECTION_LIMIT - 40))
    blocks: list[dict[str, Any]] = [
        {
            "type": "section",
            "block_id": "botd_approval_summary",
            "text": {"type": "mrkdwn", "text": f"*Approval needed*\n```{body}```"},
        },
        {
            "type": "actions",
            "block_id": "botd_approval",
            "elements": [
                {
                    "type": "button",
                    "action_id": APPROVE_ACTION,
                    "text": {"type": "plain_text", "text": "Approve"},
                    "style": "primary",
                    "value": approval_id,
                },
                {
                    "type": "button",
                    "action_id": DENY_ACTION,
                    "text": {"type": "plain_text", "text": "Deny"},
                    "style": "danger",
                    "value": approval_id,
                },
            ],
        },
    ]
    fallback = "Approval needed: " + escape_text(_clip(summary, 300))
    return fallback, blocks


def approval_decided(
    message: dict[str, Any], decision: Literal["approve", "deny"], user_id: str
) -> tuple[str, list[dict[str, Any]]]:
    """(text, blocks) of a prompt once answered: its summary kept, the buttons replaced."""
    verdict = "✅ Approved" if decision == "approve" else "❌ Denied"
    line = f"{verdict} by <@{user_id}>"
    kept = [
        block
        for block in message.get("blocks") or []
        if isinstance(block, dict) and block.get("type") == "section"
    ]
    blocks = [*kept, {"type": "context", "elements": [{"type": "mrkdwn", "text": line}]}]
    return line, blocks
