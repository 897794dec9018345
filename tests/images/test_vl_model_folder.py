"""The tiny VL model folder the demo saves: verl's own ``hf_processor`` builds its processor (through the folder's
remote-code class, torchvision being missing), as the trainer, the dataset and the agent-loop worker do."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
from vl_rollouts import make_image


def test_verl_builds_the_folders_processor_with_remote_code(tiny_vl_dir: Path, vl_processor: Any) -> None:
    from verl.utils.tokenizer import hf_processor

    processor = hf_processor(str(tiny_vl_dir), trust_remote_code=True, use_fast=True)
    # verl binds get_rope_index by this class name: without it the trainer computes 1D positions for an mrope model
    assert type(processor).__name__ == "Qwen2_5_VLProcessor" and hasattr(processor, "get_rope_index")
    assert processor.config.model_type == "qwen2_5_vl"
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image", "image": make_image(84, 56)}, {"type": "text", "text": "hi"}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    image = make_image(84, 56)
    got = processor(text=[text], images=[image], return_tensors="np")
    want = vl_processor(text=[text], images=[image], return_tensors="np")
    assert got["input_ids"].tolist() == want["input_ids"].tolist()
    assert np.array_equal(got["image_grid_thw"], want["image_grid_thw"])
    assert np.allclose(got["pixel_values"], want["pixel_values"])


def test_without_remote_code_verl_gets_no_processor(tiny_vl_dir: Path) -> None:
    # why the VL demo sets trust_remote_code: verl's hf_processor swallows the failure and returns None, and its VL
    # token builder then refuses a qwen2_5_vl model
    from verl.utils.tokenizer import hf_processor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert hf_processor(str(tiny_vl_dir), trust_remote_code=False) is None


def test_the_gateways_loader_builds_it_without_remote_code(tiny_vl_dir: Path) -> None:
    from verl_ext.runtime.images import load_processor

    loaded = load_processor(tiny_vl_dir)
    assert type(loaded.processor).__name__ == "Qwen2_5_VLProcessor" and "video processor standing in" in loaded.how
