"""The marker renders the check reads a template's facts from, with tools where the template needs them.

The check learns what a template writes (its call markers, the frame around content, a prompt's tail, a message's
shape) by rendering marker conversations once per template. Those renders pass no tools, and most templates render
without. Some only render with a tool list: Hermes' tool_use templates iterate ``tools`` unguarded, so every such
render failed there and the check knew none of the template's facts (no call markers, no prompt tail: its stricter
fallbacks then read the template's own spacing as defects). Where a render without tools fails, it is tried once
more with two plain tools, named as the probe calls name them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# The tools the probe conversations call (``calculator``, ``search``), with one string parameter: nothing a
# schema-expanding template cannot expand.
PROBE_TOOLS: tuple[dict[str, Any], ...] = tuple(
    {
        "type": "function",
        "function": {
            "name": name,
            "description": "A probe tool.",
            "parameters": {"type": "object", "properties": {"x": {"type": "string", "description": "x"}}},
        },
    }
    for name in ("calculator", "search")
)


def with_tools_if_needed(render: Callable[[Sequence[Mapping[str, Any]] | None], T]) -> T:
    """``render(None)``; where that raises (a template that renders only with a tool list), ``render(PROBE_TOOLS)``,
    whose exception, if any, propagates to the caller (which has its own fallback for a template it cannot render)."""
    try:
        return render(None)
    except Exception:  # noqa: BLE001 - jinja raises many types; the retry with tools says whether tools were needed
        return render(PROBE_TOOLS)
