"""The re-feed audit on the real CPU engine (tiny Qwen3, real tokenizer), over a two-call rollout built as verl_ext's
loop builds one (call outputs mask 1, the tool reply mask 0): a clean engine agrees with itself at its scoring gap;
an engine that misreports one turn is found at that turn; a lying scoring path is refused and nothing is scored; a
re-score after a weight update is not compared."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from verl_ext.core.numerics import NumericsOptions
from verl_ext.core.refeed import CPU_SCORING_TOLERANCE
from verl_ext.engines.cpu import CPUGenerationServer
from verl_ext.engines.refeed_audit import RefeedAuditor

MESSAGES = [{"role": "user", "content": "What is 12 * 7? Use the calculator tool."}]
TOOL_REPLY = "\n<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
PARAMS = {"temperature": 1.0, "logprobs": True, "max_tokens": 10, "ignore_eos": True}


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))


def auditor(srv: CPUGenerationServer, prompt: list[int], fraction: float = 1.0) -> RefeedAuditor:
    async def generate(ids: list[int], params: dict[str, Any]) -> Any:
        return await srv.generate(ids, params, "canary")

    return RefeedAuditor(
        "verl_ext_cpu",
        generate,
        srv.score,
        canary_prompt=prompt,
        tolerance=CPU_SCORING_TOLERANCE,
        fraction=fraction,
        options=NumericsOptions(),
    )


def rollout(srv: CPUGenerationServer, tokenizer: Any) -> dict[str, Any]:
    """Two engine calls with a tool reply between: the response, its mask, logprobs and turn starts."""
    prompt = list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False))
    reply = tokenizer.encode(TOOL_REPLY, add_special_tokens=False)
    first = asyncio.run(srv.generate(prompt, dict(PARAMS), "a"))
    second = asyncio.run(srv.generate([*prompt, *first.token_ids, *reply], dict(PARAMS), "b"))
    response = [*first.token_ids, *reply, *second.token_ids]
    return {
        "prompt_ids": prompt,
        "response_ids": response,
        "response_logprobs": [*first.log_probs, *[0.0] * len(reply), *second.log_probs],
        "response_mask": [1] * len(first.token_ids) + [0] * len(reply) + [1] * len(second.token_ids),
        "turn_starts": [0, len(first.token_ids) + len(reply)],
        "sampled_version": second.extra_fields["global_steps"],
    }


def server(model_dir: Path, faults: Any = None) -> CPUGenerationServer:
    return CPUGenerationServer(str(model_dir), prompt_length=512, response_length=64, seed=0, faults=faults)


def test_a_clean_engine_agrees_with_itself(tiny_qwen3_dir: Path, tokenizer: Any) -> None:
    srv = server(tiny_qwen3_dir)
    ro = rollout(srv, tokenizer)
    result = asyncio.run(auditor(srv, ro["prompt_ids"]).audit("r1", **ro, step=1))
    assert result is not None and result.reason == "" and result.numerics is not None
    n = result.numerics
    assert n.source == "refeed" and n.overall.count == 20 and n.overall.max_abs <= 1e-5
    assert n.verdict(NumericsOptions()).status == "ok"


def test_an_engine_misreporting_one_turn_is_found_at_that_turn(tiny_qwen3_dir: Path, tokenizer: Any) -> None:
    srv = server(tiny_qwen3_dir, [{"kind": "turn", "turn": 1, "shift": -0.5}])
    ro = rollout(srv, tokenizer)
    result = asyncio.run(auditor(srv, ro["prompt_ids"]).audit("r1", **ro))
    assert result is not None and result.numerics is not None, result
    n = result.numerics
    assert n.by_turn[0].max_abs <= 1e-5
    assert n.by_turn[1].mean_delta == pytest.approx(0.5, abs=1e-5)  # re-score - sampled: what the report hid
    verdict = n.verdict(NumericsOptions())
    assert verdict.status == "drift" and verdict.turn == 1


def test_a_lying_scoring_path_is_refused_and_never_scores(tiny_qwen3_dir: Path, tokenizer: Any) -> None:
    srv = server(tiny_qwen3_dir, [{"kind": "score_shift", "shift": -20.0}])
    ro = rollout(srv, tokenizer)
    audit = auditor(srv, ro["prompt_ids"])
    scored: list[Any] = []
    real_score = audit._score

    async def counting(*args: Any) -> Any:
        scored.append(args)
        return await real_score(*args)

    audit._score = counting  # type: ignore[assignment]
    for rollout_id in ("r1", "r2"):
        result = asyncio.run(audit.audit(rollout_id, **ro))
        assert result is not None and result.numerics is None
        assert "the scoring path of verl_ext_cpu is refused" in result.reason
    assert len(scored) == 1  # the canary's own scoring, once; no rollout was scored


def test_not_compared_after_a_weight_update_and_only_the_sampled_fraction(tiny_qwen3_dir: Path, tokenizer: Any) -> None:
    srv = server(tiny_qwen3_dir)
    ro = rollout(srv, tokenizer)
    audit = auditor(srv, ro["prompt_ids"], fraction=0.5)
    asyncio.run(audit.canary())
    asyncio.run(srv.set_global_steps(1))  # weights moved on before the audit
    chosen = [i for i in (f"r{k}" for k in range(40)) if asyncio.run(audit.audit(i, **ro)) is not None]
    assert 8 <= len(chosen) <= 32
    result = asyncio.run(audit.audit(chosen[0], **ro))
    assert result is not None and result.numerics is None and "a weight update came between" in result.reason
