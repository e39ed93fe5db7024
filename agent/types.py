"""Core value types shared by the agent, the channels, the scheduler and the daemon.

They are pydantic models so that they round-trip through Redis as JSON exactly.
"""

from __future__ import annotations

import base64
import os
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Channel = Literal["telegram", "slack", "console", "cron", "heartbeat", "test"]
RunKind = Literal["chat", "heartbeat", "cron"]
PromptMode = Literal["full", "minimal"]
Category = Literal["read", "write", "admin"]
Role = Literal["system", "user", "assistant", "tool"]
RunStatus = Literal["completed", "failed", "cancelled", "max_iterations"]
# Did a run's answer reach the chat? Shared by the gateway's outcomes and the scheduler's ledger.
DeliveryStatus = Literal["delivered", "silent", "failed", "unknown"]


def new_id() -> str:
    """A short random id for runs, approvals and jobs."""
    return uuid.uuid4().hex[:16]


class ToolPolicy(BaseModel):
    """Which tool categories a run may use.

    ``interactive`` runs (a person is in the chat) auto-approve read and write and ask
    for approval before admin; ``scheduled`` runs (cron, heartbeat) allow read, and
    write/admin only when listed in ``allow``.
    """

    model_config = ConfigDict(frozen=True)

    context: Literal["interactive", "scheduled"] = "interactive"
    allow: tuple[Category, ...] = ()


class TelegramChat(BaseModel):
    """What the Telegram channel needs to answer in a chat (it replies to the trigger
    only outside private chats)."""

    model_config = ConfigDict(frozen=True)

    platform: Literal["telegram"] = "telegram"
    chat_type: str  # private, group, supergroup or channel (as Telegram says)
    is_forum: bool = False


class SlackChat(BaseModel):
    """The Slack workspace and kind of conversation a request came from."""

    model_config = ConfigDict(frozen=True)

    platform: Literal["slack"] = "slack"
    team: str
    scope: Literal["dm", "channel"]


# Platform facts about the chat, chosen by the channel that built the request and handed
# back to it with the reply's Target (channels.base.Target).
ChatRef = Annotated[TelegramChat | SlackChat, Field(discriminator="platform")]


AttachmentKind = Literal["photo", "document", "audio", "voice", "video", "video_note", "sticker", "file"]


class Attachment(BaseModel):
    """A file a person sent with a message, as the platform describes it (nothing fetched yet).

    ``name``, ``mime`` and ``size`` are the platform's claims: shown to nobody as a path and
    checked again while the file is downloaded.
    """

    model_config = ConfigDict(frozen=True)

    kind: AttachmentKind
    file_id: str  # the platform's handle: a Telegram file_id, a Slack file id
    name: str = ""
    mime: str = ""
    size: int | None = None
    url: str | None = None  # where to download it, when the platform says so up front (Slack)
    unsupported: str | None = None  # why it cannot be fetched at all (told to the model and the person)


class RunRequest(BaseModel):
    """One unit of work for the gateway: a chat message, a heartbeat or a cron fire."""

    # Read from JSON on every hop through the store. Its values (run ids, session keys,
    # chat ids) are new for every message or session: caching them, as pydantic does by
    # default, fills its process-wide string cache (16,384 entries) for nothing.
    model_config = ConfigDict(cache_strings="keys")
    run_id: str = Field(default_factory=new_id)
    session_key: str
    agent_id: str = "main"
    channel: Channel
    chat_id: str
    thread_id: str | None = None
    user_id: str = ""
    user_name: str = ""
    text: str
    kind: RunKind = "chat"
    prompt_mode: PromptMode = "full"
    reply_to: str | None = None
    tool_policy: ToolPolicy = Field(default_factory=ToolPolicy)
    received_at: float = Field(default_factory=time.time)
    dedupe_key: str | None = None
    chat: ChatRef | None = None
    attachments: list[Attachment] = Field(default_factory=list)
    # Scheduling facts for the daemon (job_id, fire_time, trigger, fresh_session, timeout_s).
    meta: dict[str, str] = Field(default_factory=dict)


class ToolCall(BaseModel):
    """A tool call as the model made it; ``arguments`` is the raw JSON string."""

    model_config = ConfigDict(frozen=True)  # part of a Message
    id: str
    name: str
    arguments: str = ""


class Message(BaseModel):
    """A chat message in the OpenAI shape, plus ``is_error`` and ``reasoning``."""

    # Frozen: a history's messages are shared between reads of it (the store's decoded
    # histories), so a change is always a copy (``model_copy(update=…)``).
    model_config = ConfigDict(cache_strings="keys", frozen=True)  # cache_strings: as RunRequest
    role: Role
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    is_error: bool = False
    reasoning: str | None = None
    name: str | None = None
    # Images for vision models, sent as ``image_url`` parts of a user message: the paths of
    # their downscaled copies (agent/images.py), read into data URLs only for the request.
    images: list[str] | None = None

    @classmethod
    def system(cls, text: str) -> Message:
        return cls(role="system", content=text)

    @classmethod
    def user(cls, text: str) -> Message:
        return cls(role="user", content=text)

    @classmethod
    def assistant(cls, text: str | None, tool_calls: list[ToolCall] | None = None) -> Message:
        return cls(role="assistant", content=text, tool_calls=tool_calls or None)

    @classmethod
    def tool(cls, tool_call_id: str, content: str, *, is_error: bool = False) -> Message:
        return cls(role="tool", tool_call_id=tool_call_id, content=content, is_error=is_error)

    def to_openai(self) -> dict[str, Any]:
        """The wire form for chat.completions (reasoning and is_error stay local)."""
        out: dict[str, Any] = {"role": self.role}
        if self.role == "assistant":
            out["content"] = self.content
            if self.tool_calls:
                out["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in self.tool_calls
                ]
        elif self.images and self.role == "user" and (urls := [u for u in map(_image_url, self.images) if u]):
            parts: list[dict[str, Any]] = [{"type": "text", "text": self.content or ""}]
            parts.extend({"type": "image_url", "image_url": {"url": url}} for url in urls)
            out["content"] = parts
        else:
            out["content"] = self.content or ""
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id or ""
        if self.name and self.role == "user":
            out["name"] = self.name
        return out

    @classmethod
    def from_openai(cls, data: dict[str, Any]) -> Message:
        """Build from the OpenAI chat form (as used by the shared cases)."""
        calls = data.get("tool_calls")
        return cls(
            role=data["role"],
            content=data.get("content"),
            tool_calls=[
                ToolCall(
                    id=str(c.get("id", "")),
                    name=str(c.get("function", {}).get("name", "")),
                    arguments=str(c.get("function", {}).get("arguments", "")),
                )
                for c in calls
            ]
            if calls
            else None,
            tool_call_id=data.get("tool_call_id"),
            is_error=bool(data.get("is_error", False)),
            reasoning=data.get("reasoning"),
            name=data.get("name"),
        )


_VISION_MIME = {".vision.jpg": "image/jpeg", ".vision.png": "image/png"}


def _image_url(ref: str) -> str | None:
    """A data URL for an image reference: a data URL as is, or the downscaled copy a path
    names (only such copies are read; None when it is gone, e.g. cleaned from the inbox)."""
    if ref.startswith("data:image/"):
        return ref
    mime = next((m for suffix, m in _VISION_MIME.items() if ref.endswith(suffix)), None)
    if mime is None or not os.path.isabs(ref):
        return None
    try:
        with open(ref, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


class Usage(BaseModel):
    """Token usage; ``estimated`` is true when the API reported none."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            estimated=self.estimated or other.estimated,
        )


class _Event(BaseModel):
    run_id: str = ""


class RunStartedEvent(_Event):
    type: Literal["run.started"] = "run.started"


class ChunkEvent(_Event):
    """A delta of the answer's text, as the model streams it."""

    type: Literal["chunk"] = "chunk"
    text: str


class ReasoningEvent(_Event):
    """A delta of the model's reasoning (kept out of chats)."""

    type: Literal["reasoning"] = "reasoning"
    text: str


class ToolCallEvent(_Event):
    type: Literal["tool.call"] = "tool.call"
    tool_call: ToolCall


class ToolResultEvent(_Event):
    """A tool call finished (or was cancelled); ``error`` is set when it failed."""

    type: Literal["tool.result"] = "tool.result"
    tool_call: ToolCall
    tool_result: Message
    duration_ms: float | None = None
    error: str | None = None


class RunCompletedEvent(_Event):
    type: Literal["run.completed"] = "run.completed"
    text: str = ""
    data: dict[str, Any] = Field(default_factory=dict)


class RunFailedEvent(_Event):
    type: Literal["run.failed"] = "run.failed"
    error: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class RunCancelledEvent(_Event):
    type: Literal["run.cancelled"] = "run.cancelled"
    text: str = ""
    data: dict[str, Any] = Field(default_factory=dict)


# Something that happened during a run, streamed to the reply path and traces: one class
# per ``type``, so a consumer matches on the class and every field it reads is there.
AgentEvent = Annotated[
    RunStartedEvent
    | ChunkEvent
    | ReasoningEvent
    | ToolCallEvent
    | ToolResultEvent
    | RunCompletedEvent
    | RunFailedEvent
    | RunCancelledEvent,
    Field(discriminator="type"),
]


class RunResult(BaseModel):
    """What a run produced: the final text and every message it added to the session."""

    text: str = ""
    messages: list[Message] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    status: RunStatus = "completed"
    error: str | None = None
    iterations: int = 0
