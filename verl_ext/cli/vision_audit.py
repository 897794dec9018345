"""The image part of ``verl-ext check-template``: for a folder that holds a processor config, what the probe derives
from the processor and the template (placeholder, boundaries, expansion rule) with worked examples, or why images
cannot be served (``verl_ext.core.images.probe_vision``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_ext.core.errors import OptionsError, TemplateError
from verl_ext.core.images import ImageTokens, VisionProfile, probe_vision
from verl_ext.core.rendering import ChatRenderer

EXAMPLE_SIZES = ((56, 56), (224, 224), (56, 112), (1280, 720))


@dataclass(frozen=True)
class VisionAudit:
    """The audit of a folder's processor with the template: ``profile`` and worked ``examples`` ((width, height,
    grid, placeholders) per test image), or ``refused`` (why images cannot be served)."""

    processor: str  # how the processor was built, or "" when it was not
    profile: VisionProfile | None = None
    examples: tuple[tuple[int, int, tuple[int, ...], int], ...] = ()
    refused: str | None = None

    @property
    def verdict(self) -> str:
        return "unsupported" if self.refused else "supported"

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "processor": self.processor,
            "profile": None if self.profile is None else self.profile.to_dict(),
            "examples": [{"size": [w, h], "grid": list(g), "placeholders": n} for w, h, g, n in self.examples],
            "refused": self.refused,
        }

    def lines(self, renderer: ChatRenderer) -> list[str]:
        """The audit's words, as ``check-template`` prints them."""
        out = [f"images: {self.verdict}" + (f" ({self.processor})" if self.processor else "")]
        if self.refused:
            return [*out, f"  {self.refused}"]
        p = self.profile
        assert p is not None
        out.append(f"  image block the template writes: {p.image_text!r}")
        out.append(
            f"  placeholder: {renderer.decode([p.placeholder_id])!r} (id {p.placeholder_id}), repeated per image by "
            "the processor"
        )
        out.append(
            f"  boundaries: before {renderer.decode(p.before_ids)!r} {list(p.before_ids)}, after "
            f"{renderer.decode(p.after_ids)!r} {list(p.after_ids)}"
        )
        out.append(f"  expansion: placeholders = product of the image's {p.grid_key} row / {p.divisor}")
        for w, h, grid, n in self.examples:
            out.append(f"    {w}x{h} image -> {p.grid_key} {list(grid)} -> {n} placeholders")
        return out


def audit_vision(renderer: ChatRenderer, folder: str | os.PathLike[str], processor: Any = None) -> VisionAudit | None:
    """The image audit of ``folder`` with ``renderer``'s template (``processor``: one built already, else the
    folder's is loaded); None when the folder holds no processor config (a text-only model: nothing to audit)."""
    if not (Path(folder) / "preprocessor_config.json").is_file():
        return None
    from verl_ext.runtime.images import LoadedProcessor, blank_image, load_processor

    make = blank_image
    try:
        loaded = load_processor(folder) if processor is None else LoadedProcessor(processor, "given")
    except OptionsError as exc:
        return VisionAudit("", refused=str(exc))
    try:
        profile = probe_vision(renderer, loaded.processor, make)
        tokens = ImageTokens(profile, loaded.processor)
        examples = []
        for w, h in EXAMPLE_SIZES:
            expanded = tokens.expand(make(w, h))
            examples.append((w, h, expanded.grid, expanded.length))
    except TemplateError as exc:
        return VisionAudit(loaded.how, refused=f"images cannot be served: {exc}")
    return VisionAudit(loaded.how, profile, tuple(examples))
