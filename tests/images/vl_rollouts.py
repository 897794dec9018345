"""Pieces of the image tests: a tool that returns screenshots, test images, and VL rollouts."""

from __future__ import annotations

from typing import Any

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "screenshot",
            "description": "Take a screenshot of the screen.",
            "parameters": {"type": "object", "properties": {"region": {"type": "string"}}},
        },
    }
]


def make_image(width: int, height: int, seed: int = 0) -> Any:
    """An RGB test image whose pixels depend on its size and ``seed`` (distinct images, distinct digests)."""
    from PIL import Image

    img = Image.new("RGB", (width, height), ((width * 7 + seed) % 256, (height * 13 + seed * 3) % 256, seed % 256))
    img.putpixel((0, 0), (seed % 256, 1, 2))
    return img
