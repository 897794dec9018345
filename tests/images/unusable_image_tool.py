"""A verl function tool that answers with the image ``UNUSABLE_IMAGE`` names (tests/images/test_vl_loop.py):
bytes that are no image, a path that is no file, a URL, an object that is no image. Load it only through verl."""

from __future__ import annotations

import os

from verl.tools.function_tool import function_tool
from verl.tools.schemas import ToolResponse

KINDS = {"bytes": b"not an image", "path": "/nonexistent/screen.png", "url": "https://x.test/a.png", "obj": 3.5}


@function_tool
def screen_capture(region: str) -> ToolResponse:
    """Take a screenshot of a region of the screen.

    Args:
        region: Which part of the screen.
    """
    return ToolResponse(text=f"screenshot of {region}", image=[KINDS[os.environ["UNUSABLE_IMAGE"]]])
