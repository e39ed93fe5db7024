"""botd's HTTP/1.1 client: keep-alive connections for the calls on a message's path.

- ``client.py``      the pool (``HTTPClient``), an answer being read (``Response``), and
                     the client under httpx2 (``HTTPXTransport``; ``HTTPXClient``, the SDK's).
- ``connection.py``  one connection: the request's head, the answer parsed as it comes
                     (llhttp), and the errors, timeouts and origins the client speaks of.
"""

from agent.http.client import HTTPClient, HTTPXClient, HTTPXTransport
from agent.http.connection import (
    MAX_BUFFERED,
    ConnectError,
    ConnectTimeout,
    HTTPError,
    HTTPTimeout,
    PoolTimeout,
    ReadTimeout,
    RemoteProtocolError,
    Timeouts,
    WriteTimeout,
    split_url,
)

__all__ = [
    "MAX_BUFFERED",
    "ConnectError",
    "ConnectTimeout",
    "HTTPClient",
    "HTTPError",
    "HTTPTimeout",
    "HTTPXClient",
    "HTTPXTransport",
    "PoolTimeout",
    "ReadTimeout",
    "RemoteProtocolError",
    "Timeouts",
    "WriteTimeout",
    "split_url",
]
