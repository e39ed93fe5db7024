"""The Redis layer of botd (DESIGN.md §4.5): one client factory, key names, sessions,
locks and leases and the adapters' key-value space (inbound dedupe is the gateway's).

Usage::

    handle = await open_redis(cfg.redis, cfg.workspace)
    sessions = SessionStore(handle.client, handle.keys)
    ...
    await handle.close()
"""

from bot.store.connection import RedisHandle, create_client, open_redis, redact_url
from bot.store.errors import LockTimeout, StoreConfigError, StoreError, StoreUnavailable
from bot.store.keys import Keys
from bot.store.kv import RedisKeyValue
from bot.store.locks import Lease, SessionLock
from bot.store.sessions import SessionInfo, SessionPage, SessionSnapshot, SessionStore, SessionUsage

__all__ = [
    "Keys",
    "Lease",
    "LockTimeout",
    "RedisHandle",
    "RedisKeyValue",
    "SessionInfo",
    "SessionLock",
    "SessionPage",
    "SessionSnapshot",
    "SessionStore",
    "SessionUsage",
    "StoreConfigError",
    "StoreError",
    "StoreUnavailable",
    "create_client",
    "open_redis",
    "redact_url",
]
