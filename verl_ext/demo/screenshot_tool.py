"""A screenshot tool for the image path's tests and demo, as a verl 0.9.1 *function tool* that answers with an image
(verl's ``ToolResponse.image``): a synthetic "screen" whose size depends on the region asked for.

Load it only through verl (``load_function_tools_from_path``), as the calculator: importing it as a module too
registers ``screenshot`` twice, which verl refuses.
"""

from __future__ import annotations

from typing import Any

from verl.tools.function_tool import function_tool
from verl.tools.schemas import ToolResponse

# Region -> (width, height): different sizes give different grids, so the expansion differs per result.
SIZES = {"top": (112, 56), "bottom": (56, 112), "full": (140, 140)}


def screen(region: str) -> Any:
    """The synthetic screenshot of ``region`` (a PIL image; unknown regions get the full screen's size)."""
    from PIL import Image

    width, height = SIZES.get(region, SIZES["full"])
    return Image.new("RGB", (width, height), (len(region) * 40 % 256, 90, 160))


@function_tool
def screenshot(region: str) -> ToolResponse:
    """Take a screenshot of a region of the screen.

    Args:
        region: Which part of the screen: "top", "bottom" or "full".
    """
    return ToolResponse(text=f"screenshot of the {region} region", image=[screen(region)])
