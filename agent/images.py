"""Images for vision models: re-encoded, downscaled copies, and the history's image budget.

An image is decoded with Pillow and re-encoded (JPEG, or PNG when it has transparency)
at most :data:`MAX_SIDE` pixels on its long side: the model gets a bounded, well-formed
picture whatever the sender's file held, and nothing but pixels survives (no metadata).
The copy is a file next to the original (``<name>.vision.jpg``); messages refer to it by
path and it becomes a data URL only in the request (``Message.to_openai``), so the stored
history stays small and an image leaves it when the inbox is cleaned. Images cost far
more context than their attachment line, so the history drops old images first, keeping
their text.

Pillow is imported on first use, not with this module: only ``llm.vision`` needs it, and
the daemon checks it can be imported at start-up when vision is on (:func:`require_pillow`).
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

from agent.types import Message

MAX_SIDE = 1568
# Decoding more pixels than this is refused (a "decompression bomb"): 64 megapixels.
MAX_PIXELS = 64_000_000
# What one image costs in a request, in tokens (a 1568 px image is about 1600 for the
# common vision models); used to fit images into the history's budget.
IMAGE_TOKENS = 1600
JPEG_QUALITY = 85


class NotAnImage(ValueError):
    """The file is not an image Pillow can decode (or it is too large to decode safely)."""


def vision_copy(path: Path, max_side: int = MAX_SIDE) -> Path:
    """Write ``path`` downscaled to ``max_side`` next to it and return the copy's path;
    blocking (run it in a thread). Raises :class:`NotAnImage`."""
    from PIL import Image, UnidentifiedImageError

    out = io.BytesIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                if img.width * img.height > MAX_PIXELS:
                    raise NotAnImage(f"the image is too large to decode ({img.width}x{img.height} pixels)")
                # In place, never a full-size copy: JPEG decodes at a reduced scale (draft) when
                # it can, then the one decoded frame is shrunk.
                img.draft("RGB", (max_side, max_side))
                img.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
                transparent = img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info)
                if transparent:
                    img.convert("RGBA").save(out, format="PNG", optimize=True)
                    suffix = ".vision.png"
                else:
                    (img if img.mode == "RGB" else img.convert("RGB")).save(out, format="JPEG", quality=JPEG_QUALITY)
                    suffix = ".vision.jpg"
    except NotAnImage:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning, OSError,
            ValueError) as exc:
        raise NotAnImage(f"not a readable image ({type(exc).__name__})") from None
    copy = path.with_name(path.name + suffix)
    part = copy.with_name(f".{copy.name}.part")
    part.write_bytes(out.getvalue())
    os.replace(part, copy)
    return copy


def require_pillow() -> None:
    """Import Pillow now; ``ImportError`` (with the fix) when it cannot be."""
    try:
        import PIL.Image  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"Pillow cannot be imported ({exc}); install it with `pip install pillow`") from None


def drop_old_images(messages: list[Message], budget_tokens: int) -> list[Message]:
    """Keep the newest images whose cost fits ``budget_tokens``; older ones lose their
    images (their text, with the attachment line, stays)."""
    spent = 0
    out: list[Message] = []
    for message in reversed(messages):
        if message.images:
            keep: list[str] = []
            for url in reversed(message.images):
                if spent + IMAGE_TOKENS > budget_tokens:
                    break
                spent += IMAGE_TOKENS
                keep.append(url)
            if len(keep) != len(message.images):
                message = message.model_copy(update={"images": list(reversed(keep)) or None})
        out.append(message)
    out.reverse()
    return out
