"""The Telegram channel's settings, decoupled from the daemon's config model.

Channels may not import ``bot``, so the daemon maps its ``telegram`` config section to
this dataclass (or hands the section to :meth:`TelegramSettings.from_config`, which
only reads attributes). Secrets are kept out of ``repr``. Rules between config keys
(``webhook_url`` required in webhook mode) are checked once, by ``bot/config.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field
from typing import Any, Literal

MESSAGE_LIMIT = 4096  # UTF-16 code units per message text
_SECRET_OK = re.compile(r"^[A-Za-z0-9_-]{1,256}$")


@dataclass(frozen=True)
class TelegramSettings:
    """What the adapter needs from ``telegram.*`` (DESIGN.md §4.2)."""

    token: str = field(repr=False)
    api_base_url: str | None = None
    mode: Literal["polling", "webhook"] = "polling"
    webhook_url: str | None = None
    webhook_secret: str | None = field(default=None, repr=False)
    webhook_path: str = "/telegram"
    dm_policy: Literal["allowlist", "open", "pairing"] = "allowlist"
    allow_from: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    require_mention: bool = True
    stream_edit_interval_s: float = 1.0
    # Tuning (defaults suit production; tests shorten them).
    lease_ttl_s: float = 30.0  # the polling leader's lease (``telegram.poll_lease_s``)
    lease_renew_s: float = 10.0
    stall_timeout_s: float = 120.0
    poll_timeout_s: int = 25
    poll_backoff_s: float = 1.0
    typing_interval_s: float = 4.0
    send_attempts: int = 4
    send_backoff_s: float = 0.5
    # Start-up: getMe is tried ``start_attempts`` times (pauses from ``connect_backoff_s``,
    # doubling) within ``start_timeout_s``; then start-up fails. Later outages are retried forever.
    start_attempts: int = 3
    start_timeout_s: float = 10.0
    connect_backoff_s: float = 1.0
    message_limit: int = MESSAGE_LIMIT
    preview_timeout_s: float = 5.0  # one preview call; a slower one ends previewing for the run
    # The first preview waits this long after the answer's first text (at most
    # stream_edit_interval_s); an answer finished by then is sent once, without a preview.
    first_preview_delay_s: float = 0.5

    def __post_init__(self) -> None:
        if not self.token or ":" not in self.token:
            raise ValueError("telegram.token must look like '<bot id>:<secret>'")
        if self.mode not in ("polling", "webhook"):
            raise ValueError(f"telegram.mode must be polling or webhook, got {self.mode!r}")
        if self.webhook_secret is not None and not _SECRET_OK.match(self.webhook_secret):
            raise ValueError("telegram.webhook_secret may only use A-Z a-z 0-9 _ - (1 to 256 characters)")
        if not self.webhook_path.startswith("/"):
            raise ValueError("telegram.webhook_path must start with '/'")
        if self.dm_policy not in ("allowlist", "open", "pairing"):
            raise ValueError(f"telegram.dm_policy must be allowlist, open or pairing, got {self.dm_policy!r}")
        if self.stream_edit_interval_s <= 0:
            raise ValueError("telegram.stream_edit_interval_s must be positive")
        if self.first_preview_delay_s < 0:
            raise ValueError("the first preview delay cannot be negative")
        if self.start_attempts < 1 or self.start_timeout_s <= 0:
            raise ValueError("telegram start-up needs at least one attempt and a positive timeout")

    @classmethod
    def from_config(cls, section: Any, **tuning: Any) -> TelegramSettings:
        """Build from any object with the config section's attributes (secrets may be SecretStr)."""
        lease_s = getattr(section, "poll_lease_s", None)
        if lease_s is not None:
            tuning = {"lease_ttl_s": float(lease_s), "lease_renew_s": float(lease_s) / 3, **tuning}
        return cls(
            token=_reveal(section.token) or "",
            api_base_url=section.api_base_url,
            mode=section.mode,
            webhook_url=section.webhook_url,
            webhook_secret=_reveal(section.webhook_secret),
            webhook_path=section.webhook_path,
            dm_policy=section.dm_policy,
            allow_from=tuple(str(x) for x in section.allow_from),
            groups=tuple(str(x) for x in section.groups),
            require_mention=bool(section.require_mention),
            stream_edit_interval_s=float(section.stream_edit_interval_s),
            **tuning,
        )

    @property
    def bot_id(self) -> str:
        """The numeric id at the start of the token (public; used to namespace keys)."""
        return self.token.split(":", 1)[0]

    @property
    def effective_webhook_secret(self) -> str:
        """The configured secret, else one derived from the token (same on every replica)."""
        if self.webhook_secret:
            return self.webhook_secret
        return hmac.new(self.token.encode(), b"botd telegram webhook secret", hashlib.sha256).hexdigest()


def _reveal(value: Any) -> str | None:
    if value is None:
        return None
    getter = getattr(value, "get_secret_value", None)
    return str(getter() if callable(getter) else value)
