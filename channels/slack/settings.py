"""What the Slack channel needs to know, mirroring the ``slack:`` config section.

The channel does not import the daemon's config model; the daemon maps it onto this
dataclass (secrets as plain strings, kept out of ``repr``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

SlackMode = Literal["socket", "http"]
DmPolicy = Literal["allowlist", "open", "pairing"]


@dataclass(frozen=True)
class SlackSettings:
    bot_token: str = field(repr=False)
    app_token: str | None = field(default=None, repr=False)
    signing_secret: str | None = field(default=None, repr=False)
    mode: SlackMode = "socket"
    api_base_url: str | None = None
    events_path: str = "/slack/events"
    dm_policy: DmPolicy = "allowlist"
    allow_from: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    require_mention: bool = True
    # Beyond the config contract: tuning with safe defaults.
    preview_interval_s: float = 1.0
    first_preview_delay_s: float = 0.5  # an answer complete sooner is posted once, without a placeholder
    api_max_retries: int = 3
    api_timeout_s: float = 30.0
    connect_timeout_s: float = 10.0
    socket_ping_interval_s: float = 10.0
    max_concurrent_intake: int = 32  # inbound events handled at once (the rest wait, unacknowledged)
    # How long an inbound request may take to be accepted before Slack is answered 503 /
    # left unacked (Slack wants its answer within 3 s and retries a 5xx).
    accept_timeout_s: float = 2.5

    def __post_init__(self) -> None:
        if not self.bot_token:
            raise ValueError("slack: bot_token is required")
        if self.mode not in ("socket", "http"):
            raise ValueError(f"slack: mode must be 'socket' or 'http', got {self.mode!r}")
        if self.mode == "socket" and not self.app_token:
            raise ValueError("slack: app_token is required in socket mode")
        if self.mode == "http" and not self.signing_secret:
            raise ValueError("slack: signing_secret is required in http mode")
        if self.first_preview_delay_s < 0:
            raise ValueError("slack: first_preview_delay_s must not be negative")
        if self.max_concurrent_intake < 1:
            raise ValueError("slack: max_concurrent_intake must be at least 1")
        if not 0 < self.accept_timeout_s < 3:
            raise ValueError("slack: accept_timeout_s must be above 0 and below Slack's 3 s")
        if self.dm_policy not in ("allowlist", "open", "pairing"):
            raise ValueError(f"slack: dm_policy must be allowlist, open or pairing, got {self.dm_policy!r}")
        if not self.events_path.startswith("/"):
            raise ValueError("slack: events_path must start with '/'")
        # Accept lists from the config model as well as tuples.
        object.__setattr__(self, "allow_from", tuple(str(v) for v in self.allow_from))
        object.__setattr__(self, "channels", tuple(str(v) for v in self.channels))

    @classmethod
    def from_config(cls, config: object, **tuning: Any) -> SlackSettings:
        """Build from anything shaped like the ``slack:`` config section.

        Secrets may be pydantic ``SecretStr`` (unwrapped here); ``tuning`` sets the
        fields beyond the config contract.
        """

        def secret(name: str) -> str | None:
            value = getattr(config, name, None)
            if value is None:
                return None
            unwrap = getattr(value, "get_secret_value", None)
            return str(unwrap() if callable(unwrap) else value)

        return cls(
            bot_token=secret("bot_token") or "",
            app_token=secret("app_token"),
            signing_secret=secret("signing_secret"),
            mode=getattr(config, "mode", "socket"),
            api_base_url=getattr(config, "api_base_url", None),
            events_path=getattr(config, "events_path", "/slack/events"),
            dm_policy=getattr(config, "dm_policy", "allowlist"),
            allow_from=tuple(getattr(config, "allow_from", ())),
            channels=tuple(getattr(config, "channels", ())),
            require_mention=bool(getattr(config, "require_mention", True)),
            **tuning,
        )

    @property
    def base_url(self) -> str:
        """The Web API base URL with the trailing slash slack_sdk expects."""
        url = self.api_base_url or "https://slack.com/api/"
        return url if url.endswith("/") else url + "/"
