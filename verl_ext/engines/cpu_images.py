"""Images for the CPU engine: a vision-language model served token-in/token-out with the request's images.

The prompt ids hold each image's placeholder already expanded (verl_ext's trajectory and verl's token builders
expand them); the engine reads the images in placeholder order, computes their pixels and grids with the model's
image processor, and runs the model with ``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids`` (without
the last, Qwen2.5-VL silently uses other positions). It never samples an image or video placeholder id: a sampled
one would pair the trainer's image list with the wrong runs (verl's vLLM server bans them the same way).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from verl_ext.core.errors import EngineRequestError


@dataclass(frozen=True)
class VisionInputs:
    """What a VL model's first forward needs beside the ids."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    mm_token_type_ids: torch.Tensor


class ServedVision:
    """The served model's image side: its image processor and placeholder ids (from its own config files)."""

    def __init__(self, model_path: str, config: Any) -> None:
        import transformers

        settings = json.loads((Path(model_path) / "preprocessor_config.json").read_text())
        name = str(settings.get("image_processor_type", ""))
        cls = getattr(transformers, name, None) or getattr(transformers, name + "Pil", None)
        if cls is None:
            raise EngineRequestError(f"verl_ext_cpu: the model's image processor {name!r} is not in transformers")
        self.image_processor = cls.from_pretrained(model_path)
        self.image_token_id = int(config.image_token_id)
        self.banned_ids = tuple(int(i) for i in (config.image_token_id, getattr(config, "video_token_id", None)) if i)

    def refuse_placeholders_without_images(self, prompt_ids: Sequence[int]) -> None:
        """Refuses a request that sends no images for a prompt holding image placeholders: the model would read
        them as text tokens (every image of the prompt dropped, silently)."""
        pads = sum(1 for i in prompt_ids if i == self.image_token_id)
        if pads:
            raise EngineRequestError(
                f"verl_ext_cpu: the prompt holds {pads} image placeholder tokens but the request has no images: pass "
                "every image of the prompt, in placeholder order, with every call"
            )

    def inputs(self, prompt_ids: Sequence[int], images: Sequence[Any]) -> VisionInputs:
        """Pixels, grids and token types for ``images`` in ``prompt_ids``; refuses a count that does not match."""
        out = self.image_processor(images=list(images), return_tensors="pt")
        grids = out["image_grid_thw"]
        merge = int(getattr(self.image_processor, "merge_size", 1) or 1)
        expected = int((grids.prod(dim=-1) // (merge * merge)).sum())
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        pads = int((ids == self.image_token_id).sum())
        if pads != expected:
            raise EngineRequestError(
                f"verl_ext_cpu: the prompt holds {pads} image placeholder tokens, its {len(images)} image(s) need "
                f"{expected}: pass every image of the prompt, in placeholder order, with placeholders expanded"
            )
        types = (ids == self.image_token_id).long()
        return VisionInputs(out["pixel_values"], grids, types)


def vision_of(model_path: str, config: Any) -> ServedVision | None:
    """The model's image side when it is a vision-language model (its config names an image token), else None."""
    if getattr(config, "image_token_id", None) is None:
        return None
    return ServedVision(model_path, config)


def ban(logits: torch.Tensor, banned_ids: Sequence[int]) -> torch.Tensor:
    """``logits`` with the banned ids made impossible (in place; the engine's own step logits)."""
    if banned_ids:
        logits[list(banned_ids)] = float("-inf")
    return logits
