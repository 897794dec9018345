"""GPU only: verl's GRPO trainer with verl_ext and the real SGLang server (tests/gpu/run_sglang_grpo.py); skipped
without a CUDA GPU and a full SGLang install (recipes/sglang/install.sh)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _gpu_and_sglang() -> bool:
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import sgl_kernel  # noqa: F401 - the CUDA kernels a real SGLang engine needs
    except Exception:
        return False
    return True


@pytest.mark.skipif(not _gpu_and_sglang(), reason="needs a CUDA GPU and SGLang 0.5.12 with its kernels")
@pytest.mark.timeout(3600)
def test_grpo_with_verl_ext_and_the_real_sglang_server(tmp_path: Path) -> None:
    script = Path(__file__).with_name("run_sglang_grpo.py")
    args = ["--out", str(tmp_path), "--steps", "3", "--min-turns", "2"]
    run = subprocess.run([sys.executable, str(script), *args], text=True)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert run.returncode == 0, summary["problems"]
    assert summary["verl_ext"]["engine_view_failures"] == 0
    assert summary["verl_ext"]["steps"] == 3 and summary["stock"]["steps"] == 3
    for arm in ("verl_ext", "stock"):  # the forced first turn: every rollout called the tool and was answered
        assert summary[arm]["engine_calls_per_rollout_min"] >= 2 and summary[arm]["rollouts_without_tool_result"] == 0


def _torchvision() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchvision") is not None


@pytest.mark.skipif(
    not (_gpu_and_sglang() and _torchvision()), reason="needs a CUDA GPU, SGLang 0.5.12 and torchvision"
)
@pytest.mark.timeout(3600)
def test_grpo_vl_arm_with_images_through_the_real_sglang_server(tmp_path: Path) -> None:
    """The VL arm: a tiny Qwen2.5-VL, a forced screenshot call, the screenshot through verl_ext's SGLang server
    (its rebuild proven, placeholders banned); every rollout holds the image, none refused, no engine-view
    failure."""
    script = Path(__file__).with_name("run_sglang_grpo.py")
    args = ["--out", str(tmp_path), "--steps", "2", "--min-turns", "2", "--arms", "verl_ext_vl"]
    run = subprocess.run([sys.executable, str(script), *args], text=True)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert run.returncode == 0, summary["problems"]
    arm = summary["verl_ext_vl"]
    assert arm["engine_view_failures"] == 0 and arm["image_prompts_refused"] == 0
    assert arm["rollouts_without_image"] == 0 and arm["images"] >= arm["rollouts_recorded"] > 0
