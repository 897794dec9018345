"""A tool's image as the loop takes it (``verl_ext.runtime.images.tool_image``): a Pillow image, or bytes or a local
file decoded to one; anything else refused with its cause."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from verl_ext.runtime.images import MAX_IMAGE_BYTES, UnusableImage, tool_image


def _png(width: int = 30, height: int = 20) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (1, 2, 3)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_images_bytes_and_files_are_taken(tmp_path: Path) -> None:
    image = Image.new("RGBA", (7, 5))
    assert tool_image(image) is image  # as the tool made it: the processor converts, the digest is of these pixels
    assert tool_image(_png()).size == (30, 20) and tool_image(bytearray(_png())).mode == "RGB"
    (tmp_path / "shot.png").write_bytes(_png(8, 9))
    assert tool_image(tmp_path / "shot.png").size == (8, 9) and tool_image(str(tmp_path / "shot.png")).size == (8, 9)


def test_a_truncated_file_fails_here_not_in_the_processor(tmp_path: Path) -> None:
    (tmp_path / "cut.png").write_bytes(_png(200, 200)[:80])
    with pytest.raises(UnusableImage, match="cannot be decoded"):
        tool_image(tmp_path / "cut.png")
    lazy = Image.open(io.BytesIO(_png(200, 200)[:80]))  # Pillow opens lazily: the header alone reads fine
    with pytest.raises(UnusableImage, match="cannot be decoded"):
        tool_image(lazy)


@pytest.mark.parametrize(
    ("value", "cause"),
    [
        (b"\x89PNG not really", "cannot be decoded as an image"),
        (b"", "cannot be decoded as an image"),
        ("/no/such/screen.png", "is not a file"),
        ("https://example.test/a.png", "the loop fetches no images"),
        (None, "a NoneType is not an image"),
        ([1, 2], "a list is not an image"),
    ],
)
def test_what_is_no_image_is_refused_with_its_cause(value: object, cause: str) -> None:
    with pytest.raises(UnusableImage, match=cause):
        tool_image(value)


def test_oversized_images_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UnusableImage, match="over 20 MiB"):
        tool_image(b"\0" * (MAX_IMAGE_BYTES + 1))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # Pillow's decompression-bomb limit, made small
    with pytest.raises(UnusableImage, match="too large to decode"):
        tool_image(_png(300, 300))
