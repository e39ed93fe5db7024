"""The Slack channel (slack-bolt AsyncApp; Socket Mode or signed HTTP Events)."""

from channels.slack.adapter import SlackChannel, SlackStartError
from channels.slack.format import format_parts, to_mrkdwn
from channels.slack.settings import SlackSettings

__all__ = ["SlackChannel", "SlackSettings", "SlackStartError", "format_parts", "to_mrkdwn"]
