"""What a Telegram message carries besides text: files as attachments, other media as placeholders.

Files the agent can read (photos, documents, audio, voice, video, video notes, static
stickers or an animated sticker's thumbnail) become :class:`Attachment` s to download
later; media it cannot use (animations, locations, polls, ...) become a short bracketed
placeholder, so the model still knows something was sent. Pure functions, no I/O.
"""

from __future__ import annotations

from telegram import Message

from agent.types import Attachment


def message_attachments(msg: Message) -> list[Attachment]:
    """The files of a message, as Telegram describes them (an animation stays a placeholder)."""
    if msg.animation is not None:
        return []
    if msg.photo:
        largest = max(msg.photo, key=lambda p: (p.width * p.height, p.file_size or 0))
        return [Attachment(kind="photo", file_id=largest.file_id, name="photo.jpg", mime="image/jpeg",
                           size=largest.file_size)]
    if msg.document is not None:
        d = msg.document
        return [Attachment(kind="document", file_id=d.file_id, name=d.file_name or "", mime=d.mime_type or "",
                           size=d.file_size)]
    if msg.audio is not None:
        a = msg.audio
        return [Attachment(kind="audio", file_id=a.file_id, name=a.file_name or a.title or "", mime=a.mime_type or "",
                           size=a.file_size)]
    if msg.voice is not None:
        v = msg.voice
        return [Attachment(kind="voice", file_id=v.file_id, name="voice.ogg", mime=v.mime_type or "audio/ogg",
                           size=v.file_size)]
    if msg.video is not None:
        v2 = msg.video
        return [Attachment(kind="video", file_id=v2.file_id, name=v2.file_name or "video.mp4",
                           mime=v2.mime_type or "video/mp4", size=v2.file_size)]
    if msg.video_note is not None:
        n = msg.video_note
        return [Attachment(kind="video_note", file_id=n.file_id, name="video_note.mp4", mime="video/mp4",
                           size=n.file_size)]
    if msg.sticker is not None:
        return _sticker_image(msg)
    return []


def _sticker_image(msg: Message) -> list[Attachment]:
    """A sticker as an image: the sticker itself when static (WebP), else its thumbnail."""
    sticker = msg.sticker
    assert sticker is not None
    emoji = sticker.emoji or ""
    if not sticker.is_animated and not sticker.is_video:
        return [Attachment(kind="sticker", file_id=sticker.file_id, name=f"sticker{emoji}.webp", mime="image/webp",
                           size=sticker.file_size)]
    thumb = sticker.thumbnail
    if thumb is None:
        return []
    return [Attachment(kind="sticker", file_id=thumb.file_id, name=f"sticker{emoji}.webp", mime="image/webp",
                       size=thumb.file_size)]


def message_body(msg: Message) -> str | None:
    """Text or caption, with a placeholder for media; None for service messages."""
    placeholder = media_placeholder(msg)
    text = msg.text if msg.text is not None else msg.caption
    if placeholder and text:
        return f"{placeholder}\n{text}"
    return placeholder or text or None


def media_placeholder(msg: Message) -> str | None:
    """A short tag for media the agent gets no file for, so the model knows something was sent."""
    if msg.animation is not None:
        return "[animation]"
    if msg.photo:
        return "[photo]"
    if msg.sticker is not None:
        return f"[sticker {msg.sticker.emoji}]" if msg.sticker.emoji else "[sticker]"
    if msg.voice is not None:
        return "[voice]"
    if msg.video_note is not None:
        return "[video message]"
    if msg.video is not None:
        return "[video]"
    if msg.audio is not None:
        title = msg.audio.title or msg.audio.file_name
        return f"[audio: {title}]" if title else "[audio]"
    if msg.document is not None:
        return f"[document: {msg.document.file_name}]" if msg.document.file_name else "[document]"
    if msg.venue is not None:
        return f"[venue: {msg.venue.title}]"
    if msg.location is not None:
        return f"[location: {msg.location.latitude:.5f}, {msg.location.longitude:.5f}]"
    if msg.contact is not None:
        return f"[contact: {msg.contact.first_name}]"
    if msg.poll is not None:
        return f"[poll: {msg.poll.question}]"
    if msg.dice is not None:
        return f"[dice {msg.dice.emoji} {msg.dice.value}]"
    return None
