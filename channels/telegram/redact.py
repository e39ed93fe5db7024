"""Keep the bot token out of library logs.

The Bot API puts the token in every URL, and httpx logs request URLs at INFO
("HTTP Request: POST https://api.telegram.org/bot<token>/getUpdates"). A filter on
the libraries' loggers replaces the token before any handler sees the record.
"""

from __future__ import annotations

import logging

REDACTED = "<telegram-token>"
LOGGERS = ("httpx", "telegram", "telegram.Bot", "telegram.BaseRequest", "telegram.HTTPXRequest")


class TokenRedactor(logging.Filter):
    """Replace a secret in log records (message and arguments)."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secret:
            return True
        try:
            message = record.getMessage()
        except Exception:
            return True
        if self.secret in message:
            record.msg = message.replace(self.secret, REDACTED)
            record.args = None
        return True

    def install(self) -> None:
        for name in LOGGERS:
            logging.getLogger(name).addFilter(self)

    def uninstall(self) -> None:
        for name in LOGGERS:
            logging.getLogger(name).removeFilter(self)
