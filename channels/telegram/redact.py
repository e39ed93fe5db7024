"""Keep the bot token out of library logs.

The Bot API puts the token in every URL, and the HTTP layer logs request URLs
("HTTP Request: POST https://api.telegram.org/bot<token>/getUpdates"; httpx at INFO,
``transport.BotAPIRequest`` at DEBUG). A filter on
the libraries' loggers replaces the token before any handler sees the record, and
:func:`scrub` cleans error texts before we log them ourselves.
"""

from __future__ import annotations

import logging
import re

REDACTED = "<telegram-token>"
# A bot token: the numeric bot id, a colon, and the 35-character secret.
_TOKEN_SHAPE = re.compile(r"(?<!\d)\d{3,}:[A-Za-z0-9_-]{30,}")


def scrub(text: str) -> str:
    """Replace anything shaped like a bot token (for error messages that go into logs)."""
    return _TOKEN_SHAPE.sub(REDACTED, text)
LOGGERS = ("httpx", "telegram", "telegram.Bot", "telegram.BaseRequest", "telegram.HTTPXRequest",
           "telegram.BotAPIRequest")


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
        cleaned = scrub(message.replace(self.secret, REDACTED))
        if cleaned != message:
            record.msg = cleaned
            record.args = None
        return True

    def install(self) -> None:
        for name in LOGGERS:
            logging.getLogger(name).addFilter(self)

    def uninstall(self) -> None:
        for name in LOGGERS:
            logging.getLogger(name).removeFilter(self)
