"""The contract between the daemon and a chat adapter (Telegram, Slack, console).

Adapters only normalize inbound traffic into :class:`RunRequest` and ``submit()`` it;
they never wait for a run. Outbound, the gateway drives a :class:`ReplyStream` per run
and decides what is delivered (after sanitizing and the silent-reply checks), so an
adapter never sees NO_REPLY or HEARTBEAT_OK text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import aiohttp
from aiohttp import web

from agent.http import ConnectError, ConnectTimeout, HTTPError, PoolTimeout, WriteTimeout
from agent.types import Attachment, ChatRef, RunRequest

Scope = Literal["dm", "group", "channel"]
ThreadKind = Literal["thread", "topic"]


# ``RunRequest.meta`` key a channel sets when the sender was admitted (e.g. as a member of
# an allowed group) but is not one of its listed users: such senders may talk to the bot
# and use its commands, but not switch the model (``/model ID``).
UNLISTED = "unlisted"


@dataclass(frozen=True)
class Target:
    """Where a reply goes: a chat, optionally a thread/topic, optionally as a reply to a message."""

    channel: str
    chat_id: str
    thread_id: str | None = None
    reply_to: str | None = None
    user_id: str | None = None
    chat: ChatRef | None = None  # the platform facts the channel chose when it built the request

    @classmethod
    def of(cls, req: RunRequest) -> Target:
        return cls(
            channel=req.channel,
            chat_id=req.chat_id,
            thread_id=req.thread_id,
            reply_to=req.reply_to,
            user_id=req.user_id or None,
            chat=req.chat,
        )


@dataclass
class SubmitResult:
    """What became of a submitted request."""

    status: Literal["queued", "duplicate", "command", "denied", "dropped", "error"]
    detail: str = ""


SubmitFn = Callable[[RunRequest], Awaitable[SubmitResult]]


class SessionKeyFn(Protocol):
    def __call__(
        self, scope: Scope, chat_id: str, *, thread: str | None = None, topic: str | None = None
    ) -> str: ...


# One write of ``KeyValue.set_many``: key, value, TTL in seconds (None: no expiry).
KeyWrite = tuple[str, str, float | None]


class KeyValue(Protocol):
    """The slice of the shared store an adapter may use (keys are namespaced by the daemon).

    ``set_many`` sends several writes in one round trip; they are not atomic together
    (each stands alone, as separate ``set`` calls would), only cheaper.
    """

    async def set_nx(self, key: str, value: str, ttl_s: float) -> bool: ...
    async def get(self, key: str) -> str | None: ...
    async def set(self, key: str, value: str, ttl_s: float | None = None) -> None: ...
    async def set_many(self, writes: Sequence[KeyWrite]) -> None: ...
    async def delete(self, key: str) -> None: ...
    async def extend_if_owner(self, key: str, value: str, ttl_s: float) -> bool: ...


RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class PairingGate(Protocol):
    """``dm_policy: pairing`` for one channel: users approved by their code count as allowed;
    a stranger's DM is answered with a code (best effort, no LLM call). With a
    ``dedupe_key`` the daemon answers each post once: False for a post answered before;
    only the store being down for that check raises (so the platform redelivers)."""

    async def is_approved(self, user_id: str) -> bool: ...
    async def challenge(self, user_id: str, user_name: str, chat_id: str, *, dedupe_key: str | None = None) -> bool: ...


@dataclass
class ChannelContext:
    """Everything an adapter gets from the daemon when it starts."""

    submit: SubmitFn
    session_key: SessionKeyFn
    kv: KeyValue
    add_route: Callable[[str, str, RouteHandler], None]
    replica_id: str
    commands: tuple[tuple[str, str], ...] = ()
    pairing: PairingGate | None = None  # set when the channel's dm_policy is pairing
    extra: dict[str, Any] = field(default_factory=dict)


class ReplyStream(Protocol):
    """The live reply of one run in one chat.

    ``preview`` receives sanitized text-so-far and throttles itself; ``deliver`` sends
    (or, for part 0, finalizes the preview into) one formatted part and returns the
    platform message id; ``discard`` removes any preview; ``close`` stops typing
    indicators and reactions. All methods must be safe to call in any order and more
    than once.
    """

    async def start(self) -> None: ...
    async def preview(self, text: str) -> None: ...
    async def deliver(self, index: int, part: str) -> str | None: ...
    async def discard(self) -> None: ...
    async def close(self) -> None: ...


class ChannelStartError(RuntimeError):
    """A channel cannot start: the platform rejected a token, or it cannot be reached.

    The message names the config key to check and is safe to show (no secrets); the CLI
    prints it as one line and exits with ``exit_code``: 2 when the configuration is wrong
    (a token the platform refuses), 1 when the environment is (unreachable, unreadable).
    """

    def __init__(self, message: str, *, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@runtime_checkable
class ToolActivity(Protocol):
    """A reply stream that also shows when a tool starts and ends (the console does;
    chat platforms keep their typing indicator instead)."""

    async def tool_started(self, name: str) -> None: ...
    async def tool_finished(self, name: str, ok: bool, ms: float) -> None: ...


@runtime_checkable
class ChannelAdapter(Protocol):
    """One chat platform, with its whole lifecycle, driven by the daemon in this order:
    ``start`` (raises :class:`ChannelStartError`), ``stop`` (no more intake; replies of
    runs still finishing may be sent), ``aclose`` (release the clients)."""

    name: str

    async def start(self, ctx: ChannelContext) -> None: ...
    async def stop(self) -> None: ...
    async def aclose(self) -> None: ...
    def is_ready(self) -> bool: ...
    def format_parts(self, markdown: str) -> list[str]: ...
    def open_stream(self, target: Target, run_id: str, *, resumed: bool = True) -> ReplyStream:
        """The reply stream of ``run_id``; ``resumed=False`` only when the caller knows no
        earlier attempt of the run can have left a preview (a first attempt), which spares
        the lookup of one."""
        ...
    async def send_text(self, target: Target, text: str) -> str | None: ...
    async def ask_approval(self, target: Target, approval_id: str, summary: str) -> None: ...


class DeliveryUnknown(Exception):
    """A send that may have shown its message: the request left and no answer came back
    (none in time, or the connection closed before one), and the platform has no
    idempotency key to ask with. Sending it again could show it twice, so it is not:
    reply parts are at most once (DESIGN.md §5)."""


def may_have_arrived(exc: BaseException) -> bool:
    """Whether a request that failed with ``exc`` may have reached the server whole and
    taken effect: no answer in time, or a connection closed or reset before one. False
    when it cannot have: no connection, no free connection, not written in time."""
    if isinstance(exc, ConnectError | PoolTimeout | ConnectTimeout | WriteTimeout):
        return False
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        return False
    # ReadTimeout, RemoteProtocolError, aiohttp's disconnects and socket read timeouts, a
    # reset mid-call, or a timeout around the whole call.
    return isinstance(exc, HTTPError | aiohttp.ClientConnectionError | aiohttp.ClientPayloadError | TimeoutError)


class FileTransferError(Exception):
    """A file could not be fetched or sent; the message is safe to show to the user and the
    model (no tokens, no platform URLs)."""


class FileTooLarge(FileTransferError):
    """The file is over the size limit (known before or found while downloading)."""


FileSink = Callable[[bytes], Awaitable[None]]


@runtime_checkable
class FileChannel(Protocol):
    """A channel that can fetch the files people send and send files to a chat.

    ``download`` streams the file in chunks to ``sink`` (never holding it whole) and
    raises :class:`FileTooLarge` as soon as more than ``max_bytes`` arrived, or
    :class:`FileTransferError` for anything else; it returns the byte count and the
    content type the platform served. ``send_file`` uploads a local file to the chat of
    ``target`` (in its thread) and returns the platform's message/file id.
    """

    async def download(self, attachment: Attachment, sink: FileSink, max_bytes: int) -> tuple[int, str]: ...
    async def send_file(self, target: Target, path: Path, caption: str | None) -> str | None: ...
