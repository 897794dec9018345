"""The CPU engine's generation functions and server on the real tiny Qwen3 model and real Qwen3 tokenizer, no Ray."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from verl_ext.core.errors import EngineRequestError
from verl_ext.core.version_spans import ids_crc
from verl_ext.engines.cpu import (
    CPUGenerationServer,
    SamplingConfig,
    default_max_tokens,
    eos_ids_of,
    filter_logits,
    forced_prefix,
    generate_tokens,
    load_model,
    load_weights,
    sampling_config_from_params,
)

TOOL_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call><|im_end|>'
MESSAGES = [
    {"role": "system", "content": "You are a careful calculator agent."},
    {"role": "user", "content": "What is 12*7? Use the calculator tool."},
]


@pytest.fixture(scope="module")
def model(tiny_qwen3_dir: Path) -> torch.nn.Module:
    return load_model(str(tiny_qwen3_dir))


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))


@pytest.fixture(scope="module")
def prompt_ids(tokenizer: Any) -> list[int]:
    return list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False))


def teacher_forced_logprobs(
    model: torch.nn.Module, prompt: list[int], output: list[int], temperature: float = 1.0
) -> torch.Tensor:
    """One full forward pass over prompt + output, no KV cache: log p(output[i] | prefix) in fp32."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + output])).logits[0].float()
    scores = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)
    return scores.gather(1, torch.tensor(output)[:, None])[:, 0]


def greedy(max_tokens: int, stop_ids: frozenset[int] = frozenset()) -> SamplingConfig:
    return SamplingConfig(max_tokens=max_tokens, temperature=0.0, stop_ids=stop_ids)


def test_length_finish_without_stop(model: torch.nn.Module, prompt_ids: list[int]) -> None:
    out = generate_tokens(model, prompt_ids, greedy(7))
    assert len(out.token_ids) == 7 and len(out.log_probs) == 7
    assert out.finish_reason == "length"
    assert out.num_forced == 0


def test_stop_token_is_kept(model: torch.nn.Module, prompt_ids: list[int]) -> None:
    free = generate_tokens(model, prompt_ids, greedy(12)).token_ids
    stop = free[4]
    out = generate_tokens(model, prompt_ids, greedy(12, frozenset({stop})))
    k = free.index(stop)
    assert out.token_ids == free[: k + 1]
    assert out.token_ids[-1] == stop
    assert out.finish_reason == "stop"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_match_teacher_forced_pass(
    model: torch.nn.Module, prompt_ids: list[int], temperature: float
) -> None:
    cfg = SamplingConfig(max_tokens=16, temperature=temperature)
    out = generate_tokens(model, prompt_ids, cfg, generator=torch.Generator().manual_seed(1))
    assert len(out.token_ids) == 16
    expected = teacher_forced_logprobs(model, prompt_ids, out.token_ids, temperature)
    assert torch.allclose(torch.tensor(out.log_probs), expected, atol=1e-5, rtol=0)


def test_sampling_is_reproducible_with_a_seeded_generator(model: torch.nn.Module, prompt_ids: list[int]) -> None:
    cfg = SamplingConfig(max_tokens=10, temperature=1.0)
    a = generate_tokens(model, prompt_ids, cfg, generator=torch.Generator().manual_seed(3))
    b = generate_tokens(model, prompt_ids, cfg, generator=torch.Generator().manual_seed(3))
    assert a.token_ids == b.token_ids and a.log_probs == b.log_probs


def test_forced_tokens_are_emitted_scored_and_stop_on_im_end(
    model: torch.nn.Module, tokenizer: Any, prompt_ids: list[int]
) -> None:
    forced = tokenizer.encode(TOOL_CALL, add_special_tokens=False)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert forced[-1] == im_end
    cfg = SamplingConfig(max_tokens=64, temperature=1.0, stop_ids=frozenset(eos_ids_of(model)))
    out = generate_tokens(model, prompt_ids, cfg, forced_ids=forced, generator=torch.Generator().manual_seed(0))
    assert out.token_ids == forced
    assert out.finish_reason == "stop" and out.num_forced == len(forced)
    assert tokenizer.decode(out.token_ids) == TOOL_CALL
    expected = teacher_forced_logprobs(model, prompt_ids, forced)
    assert torch.allclose(torch.tensor(out.log_probs), expected, atol=1e-5, rtol=0)


def test_forced_tokens_are_cut_at_max_tokens(model: torch.nn.Module, tokenizer: Any, prompt_ids: list[int]) -> None:
    forced = tokenizer.encode(TOOL_CALL, add_special_tokens=False)
    out = generate_tokens(model, prompt_ids, greedy(5), forced_ids=forced)
    assert out.token_ids == forced[:5] and out.finish_reason == "length"


def test_forced_prefix_only_on_the_first_turn() -> None:
    force = [7, 8, 9]
    assert forced_prefix([1, 2, 3], force) == force
    assert forced_prefix([1, 7, 8, 9, 4, 5], force) == []
    assert forced_prefix([1, 7, 8, 4, 9], force) == force
    assert forced_prefix([1, 2], []) == []


def test_sampling_params_from_verl() -> None:
    # what verl's agent loop sends (agent_loop.py), plus the tool parser's stop ids
    params = {"temperature": 0.9, "top_p": 0.8, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    cfg = sampling_config_from_params({**params, "stop_token_ids": [5]}, default_max_tokens=40, eos_ids=[1, 2])
    assert cfg == SamplingConfig(
        max_tokens=40, temperature=0.9, top_p=0.8, top_k=-1, stop_ids=frozenset({1, 2, 5}), logprobs=True
    )
    assert sampling_config_from_params({"max_tokens": 3}, default_max_tokens=40, eos_ids=[1]).max_tokens == 3
    assert sampling_config_from_params({"max_new_tokens": 4}, default_max_tokens=40, eos_ids=[1]).max_tokens == 4
    no_eos = sampling_config_from_params({"ignore_eos": True, "stop_token_ids": [5]}, default_max_tokens=4, eos_ids=[1])
    assert no_eos.stop_ids == frozenset({5}) and no_eos.logprobs is False
    with pytest.raises(EngineRequestError, match="unsupported sampling_params"):  # a ValueError too
        sampling_config_from_params({"n": 2}, default_max_tokens=4, eos_ids=[])
    with pytest.raises(EngineRequestError, match="repetition_penalty"):
        sampling_config_from_params({"repetition_penalty": 1.1}, default_max_tokens=4, eos_ids=[])


def test_default_max_tokens_is_vllms_budget() -> None:
    assert default_max_tokens(100, prompt_length=512, response_length=64, max_model_len=None) == 64
    assert default_max_tokens(560, prompt_length=512, response_length=64, max_model_len=None) == 16
    assert default_max_tokens(570, prompt_length=512, response_length=64, max_model_len=None) == 6
    assert default_max_tokens(100, prompt_length=512, response_length=64, max_model_len=120) == 20


def test_filter_logits_top_k_and_top_p() -> None:
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    assert torch.isinf(filter_logits(logits, top_k=2, top_p=1.0)).tolist() == [False, False, True, True]
    # p = softmax = [0.64, 0.24, 0.09, 0.03]: top_p 0.7 keeps the two tokens needed to reach it
    assert torch.isinf(filter_logits(logits, top_k=-1, top_p=0.7)).tolist() == [False, False, True, True]
    assert torch.isinf(filter_logits(logits, top_k=-1, top_p=0.1)).tolist() == [False, True, True, True]


def test_load_weights_copies_every_tensor_and_refuses_partial_syncs(tiny_qwen3_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    served = load_model(str(tiny_qwen3_dir))
    trainer = AutoModelForCausalLM.from_config(served.config)
    state = trainer.state_dict()
    names = [n for n, _ in trainer.named_parameters()]  # tied lm_head.weight appears once, as the embedding
    assert load_weights(served, ((n, state[n]) for n in names)) == len(names)
    for name, tensor in served.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    with pytest.raises(ValueError, match="missing"):
        load_weights(served, ((n, state[n]) for n in names[1:]))
    with pytest.raises(ValueError, match="unknown keys"):
        load_weights(served, [*((n, state[n]) for n in names), ("not.a.weight", torch.zeros(1))])


def test_server_returns_verl_token_output_and_forces_the_first_turn_only(
    tiny_qwen3_dir: Path, tokenizer: Any, prompt_ids: list[int]
) -> None:
    server = CPUGenerationServer(
        str(tiny_qwen3_dir), prompt_length=512, response_length=48, seed=0, force_text=TOOL_CALL
    )
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}

    async def run() -> tuple[Any, Any]:
        first = await server.generate(prompt_ids=prompt_ids, sampling_params=dict(params), request_id="a")
        tool_turn = tokenizer.encode(
            "\n<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False,
        )
        second = await server.generate(
            prompt_ids=prompt_ids + first.token_ids + tool_turn, sampling_params=dict(params), request_id="b"
        )
        return first, second

    first, second = asyncio.run(run())
    assert tokenizer.decode(first.token_ids) == TOOL_CALL
    assert first.stop_reason == "stop" and len(first.log_probs) == len(first.token_ids)
    assert first.extra_fields["global_steps"] is None  # no weight sync yet
    report = first.extra_fields["verl_ext_engine"]  # the version it was generated on, stamped when it took the model
    assert report["weight_version_at_dispatch"] is None and report["complete"] is True
    assert report["prompt_crc32"] == ids_crc(prompt_ids)
    assert second.token_ids[: len(first.token_ids)] != first.token_ids  # sampled, not forced again
    assert second.stop_reason in ("stop", "length") and len(second.log_probs) == len(second.token_ids)
    assert len(second.token_ids) <= 48


def test_forced_tokens_then_sampling_continue_from_the_forced_ids(
    model: torch.nn.Module, prompt_ids: list[int]
) -> None:
    # forced ids without a stop: read in the prompt's pass, then sampling goes on after them
    forced = [1000, 2000, 3000]
    cfg = SamplingConfig(max_tokens=8, temperature=1.0)
    out = generate_tokens(model, prompt_ids, cfg, forced_ids=forced, generator=torch.Generator().manual_seed(5))
    assert out.token_ids[:3] == forced and len(out.token_ids) == 8 and out.num_forced == 3
    expected = teacher_forced_logprobs(model, prompt_ids, out.token_ids)
    assert torch.allclose(torch.tensor(out.log_probs), expected, atol=1e-5, rtol=0)


def test_prefix_cache_feeds_only_new_ids_and_scores_as_a_full_pass(
    model: torch.nn.Module, prompt_ids: list[int]
) -> None:
    from verl_ext.engines.prefix_cache import PrefixCache

    cache = PrefixCache()
    cfg = SamplingConfig(max_tokens=6, temperature=1.0)
    first = generate_tokens(model, prompt_ids, cfg, generator=torch.Generator().manual_seed(2), prefix_cache=cache)
    fed = prompt_ids + first.token_ids[:-1]  # every id the model read: all but the last output id
    assert cache.ids == fed and cache.past.get_seq_length() == len(fed)
    # the next turn extends it; then a prompt that departs inside the cached prefix (another rollout) crops it
    for prompt in (prompt_ids + first.token_ids + [198, 151644, 872], prompt_ids[:7] + [5, 6, 7]):
        out = generate_tokens(model, prompt, cfg, generator=torch.Generator().manual_seed(3), prefix_cache=cache)
        expected = teacher_forced_logprobs(model, prompt, out.token_ids)
        assert torch.allclose(torch.tensor(out.log_probs), expected, atol=1e-5, rtol=0)
        assert cache.ids == prompt + out.token_ids[:-1] and cache.past.get_seq_length() == len(cache.ids)


def test_server_forces_every_turn_and_drops_its_prefix_cache_on_new_weights(
    tiny_qwen3_dir: Path, tokenizer: Any, prompt_ids: list[int]
) -> None:
    server = CPUGenerationServer(
        str(tiny_qwen3_dir),
        prompt_length=512,
        response_length=96,
        force_text=TOOL_CALL,
        force_every_turn=True,
        prefix_cache=True,
    )
    params = {"temperature": 1.0, "logprobs": True}

    async def run() -> tuple[Any, Any]:
        first = await server.generate(prompt_ids, dict(params), "a")
        second = await server.generate(prompt_ids + first.token_ids + [198], dict(params), "b")
        return first, second

    first, second = asyncio.run(run())
    assert tokenizer.decode(first.token_ids) == TOOL_CALL == tokenizer.decode(second.token_ids)  # forced again
    assert server.cache is not None and server.cache.ids
    asyncio.run(server.update_weights(list(server.model.state_dict().items())))
    assert not server.cache.ids and server.cache.past is None  # keys and values of the old weights are gone
