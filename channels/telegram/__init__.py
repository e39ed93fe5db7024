"""Telegram channel (python-telegram-bot in botd's own event loop)."""

from channels.telegram.adapter import TelegramChannel, TelegramStartError
from channels.telegram.settings import TelegramSettings

__all__ = ["TelegramChannel", "TelegramSettings", "TelegramStartError"]
