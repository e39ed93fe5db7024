"""Telegram channel (python-telegram-bot in botd's own event loop).

python-telegram-bot is imported here first, with two optional imports of its own skipped:
``cryptography`` for Telegram Passport and httpx's command-line tool (click, pygments).
botd uses neither, and when they are installed (the MCP SDK brings ``cryptography``)
they stay resident for the daemon's whole life: ~9 MiB, most of it OpenSSL. Each library
imports its own inside ``try/except ImportError``, its way of running without it; the
skip lasts only while ``telegram`` loads, so anything else may still import them.
"""

import contextlib
import sys
from collections.abc import Iterator

_NOT_FOR_BOTD = ("cryptography.hazmat.backends", "httpx._main")


@contextlib.contextmanager
def _skipped(names: tuple[str, ...]) -> Iterator[None]:
    """Make ``import name`` fail with ImportError meanwhile, unless it is already loaded."""
    blocked = [name for name in names if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]  # the import system's "not importable"
    try:
        yield
    finally:
        for name in blocked:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


with _skipped(_NOT_FOR_BOTD):
    import telegram  # noqa: F401  # first, under the skip: the modules below import from it

from channels.telegram.adapter import TelegramChannel, TelegramStartError  # noqa: E402
from channels.telegram.settings import TelegramSettings  # noqa: E402

__all__ = ["TelegramChannel", "TelegramSettings", "TelegramStartError"]
