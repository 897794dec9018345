"""Shared fixtures of the image tests: the Qwen2.5-VL processor built offline, its probed profile, test images."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from vl_rollouts import make_image

from verl_ext.core.images import ImageTokens, VisionProfile, probe_vision
from verl_ext.core.rendering import ChatRenderer


@pytest.fixture(scope="session")
def vl_processor(tokenizer_dirs: dict[str, Path]) -> Any:
    from verl_ext.demo.vl_model import build_vl_processor

    return build_vl_processor(tokenizer_dirs["qwen2.5"])


@pytest.fixture(scope="session")
def vl_renderer(vl_processor: Any) -> ChatRenderer:
    return ChatRenderer(vl_processor.tokenizer)


@pytest.fixture(scope="session")
def vision_profile(vl_renderer: ChatRenderer, vl_processor: Any) -> VisionProfile:
    return probe_vision(vl_renderer, vl_processor, make_image)


@pytest.fixture(scope="session")
def image_tokens(vision_profile: VisionProfile, vl_processor: Any) -> ImageTokens:
    return ImageTokens(vision_profile, vl_processor)


@pytest.fixture(scope="session")
def images() -> Callable[..., Any]:
    return make_image


@pytest.fixture(scope="session")
def tiny_vl_dir(tokenizer_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2.5-VL saved with the Qwen2.5 tokenizer, the VL template and the processor settings."""
    from verl_ext.demo.vl_model import save_tiny_vl_model

    return save_tiny_vl_model(tmp_path_factory.mktemp("tiny-vl"), tokenizer_dirs["qwen2.5"])
