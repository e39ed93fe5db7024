"""Structured JSON logs (structlog) with run_id/session_key context and secret redaction."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, TextIO

import structlog

# Values of keys with these names are never logged.
_SECRET_KEY = re.compile(r"(token|secret|password|api_key|apikey|authorization|signature)", re.IGNORECASE)
# Secret-looking substrings inside free text.
_SECRET_TEXT = re.compile(
    r"(sk-[A-Za-z0-9_\-]{8,}|xox[abposr]-[A-Za-z0-9\-]{8,}|xapp-[A-Za-z0-9\-]{8,}|\b\d{6,12}:[A-Za-z0-9_\-]{30,}\b"
    r"|(?<=://)[^/\s:@]+:[^/\s@]+(?=@))"
)
_known_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember a configured secret so it is masked wherever it appears in a log line."""
    if value and len(value) >= 6:
        _known_secrets.add(value)


def redact_text(text: str) -> str:
    for secret in _known_secrets:
        if secret in text:
            text = text.replace(secret, "***")
    return _SECRET_TEXT.sub("***", text)


def _redact(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: ("***" if _SECRET_KEY.search(str(k)) else _redact(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact(v) for v in value]
    return value


def redact_processor(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event_dict):
        if _SECRET_KEY.search(key) and key != "event":
            event_dict[key] = "***"
        else:
            event_dict[key] = _redact(event_dict[key])
    return event_dict


def open_log_file(path: Path) -> TextIO:
    """Append to ``path`` (private to the user), for commands whose terminal is a conversation."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return os.fdopen(fd, "a", encoding="utf-8", buffering=1)


def configure_logging(level: str = "info", fmt: str = "json", stream: TextIO | None = None) -> None:
    """Route structlog and stdlib logging to ``stream`` (default stderr), one JSON object per line."""
    out = stream or sys.stderr
    lvl = getattr(logging, level.upper(), logging.INFO)
    renderer: Any = structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer()
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, redact_processor, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.WriteLoggerFactory(file=out),  # one write per line
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processor=renderer,
            foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder(), redact_processor],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(lvl)
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2", "apscheduler", "telegram.ext", "slack_bolt", "slack_sdk", "openai"):
        logging.getLogger(noisy).setLevel(max(lvl, logging.WARNING))
