"""Images in ``verl_ext_tool_agent``: the pieces the loop calls where a prompt or a tool result holds images.

- ``vision_for``: the probed image profile of verl's processor + the loop's template, once per process (None for a
  text-only model; a VL processor the probe cannot serve is refused with the cause);
- ``prompt_images_decoded``: the prompt's images as the processor reads them (a dataset image that is none: refused);
- ``tool_message``: a tool result's images as content parts, images first then the text, as verl's tool_agent
  builds them (``ToolResponse.image``);
- ``image_sample``: the trainer sample cut so that no image's placeholder run is cut in two, with the images the
  trainer gets (``multi_modal_data``: every image whose run it holds, in placeholder order), the record's
  evidence for the image view, and the messages as the record holds them (images as digests).
verl's worker computes ``multi_modal_inputs`` (pixels, grids) and the mrope ``position_ids`` from
``multi_modal_data`` and the ids (``AgentLoopWorker._agent_loop_postprocess``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from verl_ext.core.errors import OptionsError
from verl_ext.core.images import has_images, part_image
from verl_ext.runtime.images import ImageSample, UnusableImage, image_sample, tool_image, vision_for

__all__ = [
    "ImageSample",
    "image_sample",
    "prompt_images_decoded",
    "refuse_images_without_vision",
    "tool_message",
    "vision_for",
]


def refuse_images_without_vision(messages: Sequence[Mapping[str, Any]], where: str) -> None:
    """A prompt or tool result with images for a model verl gives no image processor: refused, never dropped."""
    if has_images(messages):
        raise OptionsError(
            f"verl_ext_tool_agent: {where} holds images but the model has no image processor (verl's processor "
            "is None: a text-only model, or a VL processor transformers could not build); serve a "
            "vision-language model, or remove the images from the data"
        )


def prompt_images_decoded(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each image part's image as the processor reads it (``tool_image``: a Pillow image; a
    path or bytes decoded). A dataset image that is none is a data error: ``OptionsError`` naming the part and the
    cause, before the engine is called (never a processor traceback mid-rollout, never a dropped image)."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list) or not any(part_image(p) is not None for p in content):
            out.append(dict(message))
            continue
        parts = []
        for k, part in enumerate(content):
            image = part_image(part)
            if image is None or part.get("type") != "image":  # an OpenAI image_url part: the gateway decodes those
                parts.append(part)
                continue
            try:
                parts.append({**part, "image": tool_image(image)})
            except UnusableImage as exc:
                raise OptionsError(
                    f"verl_ext_tool_agent: the prompt's messages[{i}].content[{k}] is not a usable image: {exc}; fix "
                    "or drop the row (verl's images column: PIL images, image bytes or local paths)"
                ) from None
        out.append({**message, "content": parts})
    return out


def tool_message(message: Mapping[str, Any], images: Sequence[Any] | None) -> dict[str, Any]:
    """``message`` with the tool's images as content parts before its text (verl's tool_agent order)."""
    if not images:
        return dict(message)
    text = message.get("content") or ""
    parts = [{"type": "image", "image": image} for image in images]
    return {**message, "content": [*parts, {"type": "text", "text": str(text)}]}
