"""The CPU engine's TEST ONLY faults (cpu_faults.py) on the real tiny Qwen3 model and tokenizer: each changes only
the numbers it says, where it says, and never what was sampled."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_ext.core.errors import OptionsError
from verl_ext.engines.cpu import CPUGenerationServer, engine_options, load_model, score_tokens
from verl_ext.engines.cpu_faults import CallNumbers, Fault, bf16_round, parse_faults, perturbed

MESSAGES = [{"role": "user", "content": "What is 12 * 7? Use the calculator tool."}]
OTHER = [{"role": "user", "content": "What is 30 - 4? Use the calculator tool."}]
TOOL_REPLY = "\n<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
PARAMS = {"temperature": 1.0, "logprobs": True, "max_tokens": 12, "ignore_eos": True, "seed": 7}


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))


def chat(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


@pytest.fixture(scope="module")
def prompt(tokenizer: Any) -> list[int]:
    return chat(tokenizer, MESSAGES)


def server(model_dir: Path, faults: Any = None) -> CPUGenerationServer:
    return CPUGenerationServer(str(model_dir), prompt_length=512, response_length=64, seed=0, faults=faults)


def call(srv: CPUGenerationServer, prompt_ids: list[int], **params: Any) -> Any:
    return asyncio.run(srv.generate(prompt_ids, {**PARAMS, **params}, "req"))


@pytest.fixture(scope="module")
def clean(tiny_qwen3_dir: Path) -> CPUGenerationServer:
    return server(tiny_qwen3_dir)


def assert_same_sample(a: Any, b: Any) -> None:
    """Everything but the logprobs is the clean run's: the fault never touched the sampled tokens' bookkeeping."""
    assert a.token_ids == b.token_ids and a.stop_reason == b.stop_reason
    assert a.extra_fields == b.extra_fields and a.num_preempted == b.num_preempted
    assert len(a.log_probs) == len(b.log_probs) == len(a.token_ids)


# -- past a depth --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [-5, 0, 1, 7, 11, 12, 40])  # depth relative to the prompt's end
def test_past_depth_shifts_exactly_the_positions_from_the_depth_on(
    tiny_qwen3_dir: Path, clean: CPUGenerationServer, prompt: list[int], offset: int
) -> None:
    depth = len(prompt) + offset
    faulted = server(tiny_qwen3_dir, [{"kind": "past_depth", "depth": depth, "shift": -0.25}])
    a, b = call(faulted, prompt), call(clean, prompt)
    assert_same_sample(a, b)
    for i, (got, want) in enumerate(zip(a.log_probs, b.log_probs, strict=True)):
        position = len(prompt) + i  # the token's absolute position, prompt included
        assert got == pytest.approx(want - 0.25 if position >= depth else want, abs=1e-12), (i, position, depth)
    assert faulted.fault_hits == {"past_depth": 1}


@settings(max_examples=200, deadline=None)
@given(
    logprobs=st.lists(st.floats(-30, 0), max_size=40),
    prompt_len=st.integers(1, 60),
    depth=st.integers(0, 120),
    shift=st.floats(-5, -1e-3),
)
def test_perturbed_past_depth_over_the_class(logprobs: list[float], prompt_len: int, depth: int, shift: float) -> None:
    out = perturbed(logprobs, prompt_len, 0, [Fault("past_depth", depth=depth, shift=shift)])
    assert len(out) == len(logprobs)
    for i, (got, want) in enumerate(zip(out, logprobs, strict=True)):
        assert got == (want + shift if prompt_len + i >= depth else want)


# -- one turn only -------------------------------------------------------------------------------------------------


def test_turn_fault_hits_only_that_engine_call_of_each_rollout(
    tiny_qwen3_dir: Path, clean: CPUGenerationServer, tokenizer: Any, prompt: list[int]
) -> None:
    faulted = server(tiny_qwen3_dir, [{"kind": "turn", "turn": 1, "shift": -0.5}])
    reply = tokenizer.encode(TOOL_REPLY, add_special_tokens=False)
    other = chat(tokenizer, OTHER)
    for srv in (faulted, clean):  # two rollouts, their calls interleaved, as an agent-loop worker sends them
        outs: dict[str, list[Any]] = {"a": [], "b": []}
        contexts = {"a": list(prompt), "b": list(other)}
        for _ in range(3):
            for name in ("a", "b"):
                out = call(srv, contexts[name])
                outs[name].append(out)
                contexts[name] = [*contexts[name], *out.token_ids, *reply]
        srv.outs = outs  # type: ignore[attr-defined]
    for name in ("a", "b"):
        for number, (got, want) in enumerate(zip(faulted.outs[name], clean.outs[name], strict=True)):  # type: ignore[attr-defined]
            assert_same_sample(got, want)
            shift = -0.5 if number == 1 else 0.0
            assert got.log_probs == pytest.approx([x + shift for x in want.log_probs], abs=1e-12), (name, number)
    assert faulted.fault_hits == {"turn": 6}  # every call is numbered; only call 1 of each rollout was shifted


def test_call_numbers_follow_the_longest_earlier_call_the_prompt_extends() -> None:
    calls = CallNumbers()
    assert calls.number([1, 2, 3]) == 0
    calls.remember([1, 2, 3], [4, 5], 0)
    assert calls.number([1, 2, 3, 4, 5, 9]) == 1
    assert calls.number([1, 2, 3, 4]) == 0  # does not hold the whole earlier call
    calls.remember([1, 2, 3, 4, 5, 9], [6], 1)
    assert calls.number([1, 2, 3, 4, 5, 9, 6, 7]) == 2
    assert calls.number([8, 1, 2, 3, 4, 5]) == 0


# -- rounded through bf16 ------------------------------------------------------------------------------------------


def is_bf16(value: float) -> bool:
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    return bits & 0xFFFF == 0  # bfloat16 is float32's top 16 bits


def test_bf16_rounds_each_reported_logprob_to_the_nearest_bf16(
    tiny_qwen3_dir: Path, clean: CPUGenerationServer, prompt: list[int]
) -> None:
    faulted = server(tiny_qwen3_dir, [{"kind": "bf16"}])
    a, b = call(faulted, prompt), call(clean, prompt)
    assert_same_sample(a, b)
    assert a.log_probs != b.log_probs
    for got, want in zip(a.log_probs, b.log_probs, strict=True):
        assert is_bf16(got)
        assert abs(got - want) <= abs(want) * 2.0**-8  # half a bf16 ulp: 7 stored mantissa bits
        assert got == bf16_round(want)


@settings(max_examples=300, deadline=None)
@given(st.floats(-60, 0, width=32))
def test_bf16_round_is_the_nearest_bf16(value: float) -> None:
    got = bf16_round(value)
    assert is_bf16(got)
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    down = struct.unpack("<f", struct.pack("<I", bits & 0xFFFF0000))[0]
    up = struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF0000) + 0x10000))[0]
    assert got in (down, up) and abs(got - value) <= min(abs(down - value), abs(up - value))


# -- selectors -----------------------------------------------------------------------------------------------------


def test_row_and_version_selectors(tiny_qwen3_dir: Path, tokenizer: Any, prompt: list[int]) -> None:
    faulted = server(
        tiny_qwen3_dir,
        [
            {"kind": "past_depth", "depth": 0, "shift": -1.0, "rows_containing": "30 - 4"},
            {"kind": "past_depth", "depth": 0, "shift": -2.0, "versions": [3]},
        ],
    )
    clean_row, other_row = call(faulted, prompt), call(faulted, chat(tokenizer, OTHER))
    reference = server(tiny_qwen3_dir)
    assert clean_row.log_probs == call(reference, prompt).log_probs
    assert other_row.log_probs == pytest.approx([x - 1.0 for x in call(reference, chat(tokenizer, OTHER)).log_probs])
    asyncio.run(faulted.set_global_steps(3))
    assert call(faulted, prompt).log_probs == pytest.approx([x - 2.0 for x in clean_row.log_probs])


# -- stale weights -------------------------------------------------------------------------------------------------


def weights(model: torch.nn.Module, seed: int) -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(n, p.detach() + 0.05 * torch.randn(p.shape, generator=generator)) for n, p in model.named_parameters()]


def test_stale_weights_serves_the_previous_syncs_weights_under_the_new_version(
    tiny_qwen3_dir: Path, prompt: list[int]
) -> None:
    base = load_model(str(tiny_qwen3_dir))
    syncs = [weights(base, seed) for seed in range(4)]  # versions 0..3
    stale, fresh = server(tiny_qwen3_dir, [{"kind": "stale_weights", "versions": [1, 2]}]), server(tiny_qwen3_dir)
    served: list[int] = []
    for version, sync in enumerate(syncs):
        asyncio.run(stale.update_weights(list(sync), global_steps=version))
        asyncio.run(fresh.update_weights(list(sync), global_steps=version))
        out = call(stale, prompt)
        assert out.extra_fields["global_steps"] == version  # reports the new version: the fault is silent
        # which sync's weights the stale engine serves: compare with a clean engine on each
        for candidate, weights_of in enumerate(syncs):
            asyncio.run(fresh.update_weights(list(weights_of), global_steps=version))
            if call(fresh, prompt).log_probs == out.log_probs:
                served.append(candidate)
                break
    assert served == [0, 0, 1, 3]  # syncs 1 and 2 not applied: each served the sync before it
    assert stale.fault_hits == {"stale_weights": 2}


# -- the scoring path ----------------------------------------------------------------------------------------------


def test_score_is_a_prefill_of_the_ids_agreeing_with_generation(
    tiny_qwen3_dir: Path, clean: CPUGenerationServer, prompt: list[int]
) -> None:
    out = call(clean, prompt, temperature=0.7)
    scored = asyncio.run(clean.score([*prompt, *out.token_ids], len(prompt), 0.7))
    assert scored["ids"] == out.token_ids and scored["global_steps"] is None
    assert scored["logprobs"] == pytest.approx(out.log_probs, abs=1e-5)
    lying = server(tiny_qwen3_dir, [{"kind": "score_shift", "shift": -20.0}])
    shifted = asyncio.run(lying.score([*prompt, *out.token_ids], len(prompt), 0.7))
    assert shifted["logprobs"] == pytest.approx([x - 20.0 for x in scored["logprobs"]], abs=1e-9)
    assert call(lying, prompt, temperature=0.7).log_probs == out.log_probs  # generation is untouched
    with pytest.raises(ValueError, match="start"):
        score_tokens(clean.model, prompt, 0)


# -- configuration -------------------------------------------------------------------------------------------------


def test_engine_kwargs_carry_the_faults_and_refuse_unknown_keys() -> None:
    from omegaconf import OmegaConf

    config = OmegaConf.create({"vllm": {}, "sglang": {}, "verl_ext_cpu": {"faults": [{"kind": "bf16"}]}})
    options = engine_options(config)
    assert options == {"faults": [{"kind": "bf16"}]} and parse_faults(options["faults"]) == (Fault("bf16"),)
    assert engine_options(OmegaConf.create({"vllm": {}})) == {} and engine_options(None) == {}
    with pytest.raises(OptionsError, match=r"unknown keys \['fault'\]"):
        engine_options({"verl_ext_cpu": {"fault": []}})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"kind": "bf16"}, "must be a list of faults"),
        ([{"kind": "bf17"}], r"kind must be one of \['past_depth'"),
        ([{"kind": "past_depth", "shift": -1}], r"missing keys \['depth'\]"),
        ([{"kind": "bf16", "depth": 3}], r"unknown keys \['depth'\]"),
        ([{"kind": "stale_weights", "versions": [1], "rows_containing": "x"}], r"unknown keys \['rows_containing'\]"),
        ([{"kind": "turn", "turn": 1, "shift": 0.5}], "shift must be a finite negative number"),
        ([{"kind": "turn", "turn": -1, "shift": -0.5}], "turn must be an integer >= 0"),
        ([{"kind": "stale_weights", "versions": []}], "versions must be a non-empty list"),
        ([{"kind": "bf16", "rows_containing": ""}], "rows_containing must be a non-empty text"),
    ],
)
def test_bad_faults_are_refused_with_the_fix(raw: Any, message: str) -> None:
    with pytest.raises(OptionsError, match=message):
        parse_faults(raw)
