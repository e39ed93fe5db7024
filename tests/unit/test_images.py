"""Images for vision models: downscaled, re-encoded data URLs; old images leave the history first."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
from PIL import Image

from agent import images
from agent.images import IMAGE_TOKENS, NotAnImage, drop_old_images, vision_copy
from agent.types import Message


def decode(url: str) -> Image.Image:
    header, data = url.split(",", 1)
    assert header.endswith(";base64")
    return Image.open(io.BytesIO(base64.b64decode(data)))


def image_data_url(path: Path) -> str:
    """The data URL the model gets for ``path``: its vision copy, as a request carries it."""
    wire = Message(role="user", content="", images=[str(vision_copy(path))]).to_openai()
    return str(wire["content"][1]["image_url"]["url"])


def save(path: Path, img: Image.Image, fmt: str, **kw: object) -> Path:
    img.save(path, format=fmt, **kw)
    return path


def test_large_photo_is_downscaled_to_the_long_side(tmp_path: Path) -> None:
    path = save(tmp_path / "p.jpg", Image.new("RGB", (2000, 4000), (1, 2, 3)), "JPEG")
    copy = vision_copy(path)
    assert copy == tmp_path / "p.jpg.vision.jpg"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jpg", "p.jpg.vision.jpg"]  # no .part left
    url = image_data_url(path)
    assert url.startswith("data:image/jpeg;base64,")
    assert decode(url).size == (784, 1568)


def test_small_image_keeps_its_size_and_metadata_is_gone(tmp_path: Path) -> None:
    img = Image.new("RGB", (320, 200), (9, 9, 9))
    exif = Image.Exif()
    exif[0x010E] = "secret description"  # ImageDescription
    path = save(tmp_path / "s.jpg", img, "JPEG", exif=exif)
    out = decode(image_data_url(path))
    assert out.size == (320, 200)
    assert 0x010E not in out.getexif()


def test_transparency_is_kept_as_png(tmp_path: Path) -> None:
    path = save(tmp_path / "t.webp", Image.new("RGBA", (3000, 100), (0, 0, 0, 0)), "WEBP")
    url = image_data_url(path)
    assert url.startswith("data:image/png;base64,")
    assert decode(url).size == (1568, 52)


def test_not_an_image_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.jpg"
    path.write_bytes(b"%PDF-1.4 not a picture")
    with pytest.raises(NotAnImage):
        image_data_url(path)


def test_too_many_pixels_are_refused_before_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save(tmp_path / "big.png", Image.new("L", (400, 300)), "PNG")
    monkeypatch.setattr(images, "MAX_PIXELS", 100_000)
    with pytest.raises(NotAnImage, match="too large"):
        image_data_url(path)


def test_old_images_are_dropped_first_and_their_text_stays() -> None:
    old = Message(role="user", content="old [attachment: /a.jpg]", images=["data:a", "data:b"])
    mid = Message.assistant("seen")
    new = Message(role="user", content="new", images=["data:c"])
    kept = drop_old_images([old, mid, new], budget_tokens=2 * IMAGE_TOKENS)
    assert [m.images for m in kept] == [["data:b"], None, ["data:c"]]
    assert kept[0].content == old.content
    assert old.images == ["data:a", "data:b"]  # the input is not changed


def test_no_budget_means_no_images() -> None:
    kept = drop_old_images([Message(role="user", content="x", images=["data:a"])], budget_tokens=0)
    assert kept[0].images is None and kept[0].to_openai() == {"role": "user", "content": "x"}


def test_only_vision_copies_are_read_and_missing_ones_are_left_out(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not an image")
    copy = vision_copy(save(tmp_path / "a.png", Image.new("RGB", (10, 10)), "PNG"))
    gone = str(tmp_path / "gone.png.vision.jpg")
    wire = Message(role="user", content="x", images=[str(secret), "relative.vision.jpg", gone, str(copy)]).to_openai()
    assert [p["type"] for p in wire["content"]] == ["text", "image_url"]
    assert wire["content"][1]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert Message(role="user", content="x", images=[gone]).to_openai() == {"role": "user", "content": "x"}


def test_user_message_with_images_is_sent_as_parts() -> None:
    wire = Message(role="user", content="look", images=["data:image/jpeg;base64,AA=="]).to_openai()
    assert wire["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AA=="}},
    ]
