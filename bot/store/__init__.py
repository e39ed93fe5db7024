"""The Redis layer of botd (DESIGN.md §4.5): one client factory, key names, sessions,
locks and leases and the adapters' key-value space (inbound dedupe is the gateway's).

- ``connection.py``  the client factory: bounded timeouts and retries; opening the store.
- ``pool.py``        the connection class and bounded pool behind every client.
- ``embedded.py``    the workspace's private Valkey, when ``redis.url`` is unset: who starts
  and stops it; ``valkey_process.py`` its binary, config file and socket-level PING/SHUTDOWN.
- ``keys.py``        every key name, in one place.
- ``owned.py``       keys that hold their owner's token; scripts queued on pipelines.
- ``locks.py``       leases and the session lock.
- ``sessions.py``    history, summary and usage per session (scripts in ``session_scripts.py``),
  and the decoded histories of recent reads; ``session_info.py`` what ``/status`` and
  ``botd sessions`` report from them.
- ``kv.py``          the channel adapters' key-value space.
- ``seal.py``, ``secret_files.py``  MACs over records botd decided; its generated secrets.
- ``errors.py``      the store's errors, phrased for the operator.

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
from bot.store.session_info import SessionInfo, SessionPage, SessionUsage
from bot.store.sessions import SessionSnapshot, SessionStore

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
