"""The re-feed canary on the real CPU engine (tiny Qwen3, real tokenizer): its scoring path passes at the calibrated
tolerance at every sampling temperature, and the same engine with shifted scores (the TEST ONLY ``score_shift``
fault) is refused."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from verl_ext.core.refeed import CPU_SCORING_TOLERANCE, calibrate_tolerance
from verl_ext.engines.cpu import CPUGenerationServer
from verl_ext.engines.scoring_canary import prove_scoring_path

MESSAGES = [{"role": "user", "content": "What is 12 * 7? Use the calculator tool."}]


@pytest.fixture(scope="module")
def prompt(tiny_qwen3_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))
    return list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False))


def server(model_dir: Path, faults: Any = None) -> CPUGenerationServer:
    return CPUGenerationServer(str(model_dir), prompt_length=512, response_length=64, seed=0, faults=faults)


def canary(srv: CPUGenerationServer, prompt: list[int], temperature: float, tolerance: float) -> Any:
    async def generate(ids: list[int], params: dict[str, Any]) -> Any:
        return await srv.generate(ids, params, "canary")

    return asyncio.run(
        prove_scoring_path("verl_ext_cpu", generate, srv.score, prompt, tolerance=tolerance, temperature=temperature)
    )


def test_the_cpu_scoring_path_passes_its_canary_at_the_calibrated_tolerance(
    tiny_qwen3_dir: Path, prompt: list[int]
) -> None:
    srv = server(tiny_qwen3_dir)
    gaps = []
    for temperature in (1.0, 0.7, 0.0):
        verdict = canary(srv, prompt, temperature, CPU_SCORING_TOLERANCE)
        assert verdict.accepted and verdict.tokens == 32, verdict.reason
        gaps.append(verdict.max_abs_delta)
    # the shipped tolerance covers what this engine shows, with room: calibrating on it stays below the constant
    assert calibrate_tolerance(gaps) <= CPU_SCORING_TOLERANCE


@pytest.mark.parametrize("shift", [-20.0, -0.01, -2 * CPU_SCORING_TOLERANCE])
def test_a_cpu_engine_whose_scores_are_shifted_is_refused(
    tiny_qwen3_dir: Path, prompt: list[int], shift: float
) -> None:
    lying = server(tiny_qwen3_dir, [{"kind": "score_shift", "shift": shift}])
    verdict = canary(lying, prompt, 1.0, CPU_SCORING_TOLERANCE)
    assert not verdict.accepted and verdict.max_abs_delta == pytest.approx(-shift, rel=0.05)
    assert "differ from generation by up to" in verdict.reason and "its scores are not used" in verdict.reason


def test_a_canary_across_a_weight_update_is_refused(tiny_qwen3_dir: Path, prompt: list[int]) -> None:
    srv = server(tiny_qwen3_dir)

    async def generate(ids: list[int], params: dict[str, Any]) -> Any:
        out = await srv.generate(ids, params, "canary")
        await srv.set_global_steps(5)  # the weights moved between generation and scoring
        return out

    verdict = asyncio.run(prove_scoring_path("verl_ext_cpu", generate, srv.score, prompt, tolerance=1e-4))
    assert not verdict.accepted and "generated on weights None and scored on 5" in verdict.reason
