"""MACs that bind records in the store to what botd itself decided.

A process that can write to the store (a tool with the sandbox off, or with network
and an external Redis) could otherwise mark its own admin call approved or give a
cron job ``admin``. Records whose meaning is a permission carry an HMAC-SHA256 keyed
by the daemon key, which lives outside the store and outside every tool's reach
(``security.secret``, else ``<workspace>/.botd/daemon.key``); a record whose MAC does
not verify grants nothing.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import structlog

from bot.config import BotdConfig
from bot.store.embedded import STATE_DIR_NAME
from bot.store.secret_files import read_or_create_secret

DAEMON_KEY_FILE = "daemon.key"
log = structlog.get_logger(__name__)


class RecordSeal:
    """Signs and verifies a sequence of fields (joined unambiguously) with one key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("the daemon key must be at least 16 bytes")
        self._key = key

    @classmethod
    def for_config(cls, cfg: BotdConfig) -> RecordSeal:
        if cfg.security.secret is not None:
            return cls(cfg.security.secret.get_secret_value().encode())
        path = Path(cfg.workspace) / STATE_DIR_NAME / DAEMON_KEY_FILE
        if cfg.redis.url:
            # Replicas share the store; only a shared workspace also shares this generated key.
            log.info("security.daemon_key_file", path=str(path),
                     note="replicas that do not share this workspace need the same security.secret")
        return cls(read_or_create_secret(path).encode())

    def sign(self, *fields: str) -> str:
        message = b"\x1f".join(f.encode("utf-8", "surrogatepass") for f in fields)
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def verify(self, mac: object, *fields: str) -> bool:
        return isinstance(mac, str) and hmac.compare_digest(mac, self.sign(*fields))
