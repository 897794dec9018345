"""The CPU engine with a VL model: images as model inputs, the placeholder ids never sampled, bad requests refused."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from vl_rollouts import make_image

from verl_ext.core.errors import EngineRequestError


@pytest.fixture(scope="module")
def server(tiny_vl_dir: Path) -> Any:
    from verl_ext.engines.cpu import CPUGenerationServer

    return CPUGenerationServer(str(tiny_vl_dir), prompt_length=512, response_length=64)


def _prompt(processor: Any, images: list[Any]) -> tuple[list[int], Any]:
    parts = [*({"type": "image", "image": im} for im in images), {"type": "text", "text": "What is this?"}]
    text = processor.apply_chat_template(
        [{"role": "user", "content": parts}], tokenize=False, add_generation_prompt=True
    )
    inputs = processor(text=[text], images=images, return_tensors="pt")
    return inputs["input_ids"][0].tolist(), inputs


def test_greedy_output_is_transformers_generate_with_the_images(server: Any, vl_processor: Any) -> None:
    images = [make_image(100, 100, 1), make_image(56, 112, 2)]
    ids, inputs = _prompt(vl_processor, images)
    out = asyncio.run(
        server.generate(ids, {"temperature": 0.0, "max_tokens": 8, "logprobs": True}, "r", image_data=images)
    )
    reference = server.model.generate(**inputs, max_new_tokens=8, do_sample=False)[0, len(ids) :].tolist()
    assert out.token_ids == reference[: len(out.token_ids)]


def test_image_placeholder_ids_are_never_sampled(server: Any, vl_processor: Any) -> None:
    pad = vl_processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    image = make_image(56, 56)
    ids, _ = _prompt(vl_processor, [image])

    def favour_pad(_module: Any, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
        output[..., pad] = 1e4  # the pad the model's overwhelming favourite: unbanned, every token would be one
        return output

    hook = server.model.lm_head.register_forward_hook(favour_pad)
    banned = server.vision.banned_ids
    try:
        out = asyncio.run(server.generate(ids, {"temperature": 1.0, "max_tokens": 6}, "r", image_data=[image]))
        assert out.token_ids and pad not in out.token_ids
        server.vision.banned_ids = ()  # the guard broken once: the pad is sampled at once
        unbanned = asyncio.run(server.generate(ids, {"temperature": 1.0, "max_tokens": 2}, "r", image_data=[image]))
        assert unbanned.token_ids[0] == pad
    finally:
        server.vision.banned_ids = banned
        hook.remove()


def test_bad_image_requests_are_refused_with_the_cause(server: Any, vl_processor: Any) -> None:
    ids, _ = _prompt(vl_processor, [make_image(100, 100, 1), make_image(56, 112, 2)])
    with pytest.raises(EngineRequestError, match="holds 24 image placeholder tokens, its 1 image"):
        asyncio.run(server.generate(ids, {"max_tokens": 2}, "r", image_data=[make_image(100, 100, 1)]))
    # no images at all for a prompt holding placeholders: the model would read them as text
    with pytest.raises(EngineRequestError, match="holds 24 image placeholder tokens but the request has no images"):
        asyncio.run(server.generate(ids, {"max_tokens": 2}, "r"))
