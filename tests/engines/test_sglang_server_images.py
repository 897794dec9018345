"""verl_ext's SGLang server with images, driven through SGLang 0.5.12's own code on CPU: its tokenizer manager's
``_tokenize_one_request`` and its Qwen-VL multimodal processor (``QwenVLImageProcessor``) over the tiny VL
processor (tests/fixtures/vl/qwen2.5-vl) rebuild each request's prompt ids as on a GPU, and its
``SamplingBatchInfo`` applies the logit bias before the greedy pick. Only the model is scripted."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from sglang_shim import load_sglang, sglang_installed
from sglang_standin import Script, ScriptedTokenizerManager, global_server_args, sglang_mm_processor

if not sglang_installed():
    if os.getenv("VERL_EXT_REQUIRE_SGLANG", "0") == "1":
        raise RuntimeError("sglang 0.5.12 is not installed; `make sglang-cpu` installs it (--no-deps, CPU only)")
    pytest.skip("sglang is not installed (make sglang-cpu)", allow_module_level=True)

IM_END, ENDOFTEXT = 151645, 151643
IMAGE_PAD, VIDEO_PAD = 151655, 151656
VOCAB = 151936
PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
HELLO, HEL, LO = 23811, 11338, 385  # Qwen2.5: " hello" is one token; " hel" + "lo" is a non-canonical split of it


def make_image(width: int, height: int, seed: int = 0) -> Any:
    from PIL import Image

    return Image.new("RGB", (width, height), ((width * 7 + seed) % 256, (height * 13) % 256, seed % 256))


@pytest.fixture(scope="module")
def vl(tokenizer_dirs: dict[str, Path]) -> Any:
    """The tiny VL processor (the Qwen2.5 tokenizer, the fixture's image settings and template) and its config."""
    load_sglang(vl=True)
    from verl_ext.demo.vl_model import build_vl_processor

    return build_vl_processor(tokenizer_dirs["qwen2.5"])


@pytest.fixture(scope="module")
def images() -> list[Any]:
    return [make_image(56, 56, 1), make_image(56, 112, 2)]


@pytest.fixture(scope="module")
def held(vl: Any, images: list[Any]) -> list[int]:
    """The ids verl_ext holds for a two-image rollout: a prompt image, a screenshot call, a tool result with an
    image, each placeholder expanded by the processor (verl_ext's trajectory equals this one-shot expansion,
    tests/images/test_image_tokens.py)."""
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Say hello world to it."}]},
        {"role": "assistant", "content": '<tool_call>\n{"name": "screenshot", "arguments": {}}\n</tool_call>'},
        {"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": "the screen"}]},
    ]
    text = vl.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = [int(i) for i in vl(text=[text], images=images, return_tensors="np")["input_ids"][0]]
    assert ids.count(HELLO) == 1 and [s for s in _runs(ids)] == [4, 8]
    return ids


def _runs(ids: list[int]) -> list[int]:
    from verl_ext.engines.sglang_images import placeholder_runs

    return [n for _, n in placeholder_runs(ids, IMAGE_PAD)]


def non_canonical(ids: list[int]) -> list[int]:
    """The same text with " hello" written as " hel" + "lo" (as a model may sample it)."""
    at = ids.index(HELLO)
    return [*ids[:at], HEL, LO, *ids[at + 1 :]]


def vl_server(vl: Any, *scripts: Script, skip_tokenizer_init: bool = True, **mm: Any) -> tuple[Any, Any]:
    from test_sglang_server import make_server

    from verl_ext.engines.sglang_server import TokenExactSGLangServer

    mm_processor = sglang_mm_processor(vl, vl.config, skip_tokenizer_init=skip_tokenizer_init)
    for key, value in mm.items():
        setattr(mm_processor, key, value)
    tm = ScriptedTokenizerManager({IM_END, ENDOFTEXT}, VOCAB, list(scripts), mm_processor=mm_processor)
    tm.tm.server_args.skip_tokenizer_init = skip_tokenizer_init
    server = make_server(TokenExactSGLangServer, tm)
    server.config.prompt_length = server.config.response_length = 512
    return server, tm


def generate(server: Any, prompt: list[int], images: list[Any] | None, params: dict[str, Any] | None = None) -> Any:
    """One ``generate`` call, in a process whose SGLang server args are set (a launched tokenizer manager sets
    them; its multimodal processor reads them)."""
    with global_server_args():
        return asyncio.run(
            server.generate(prompt, dict(params or {**PARAMS, "max_tokens": 8}), "req-vl", image_data=images)
        )


def test_images_reach_sglang_in_order_and_sglang_keeps_the_ids(vl: Any, images: list[Any], held: list[int]) -> None:
    """The request carries the expanded ids and the images in placeholder order; SGLang's own rebuild of the ids
    (decode, collapse each run, re-expand by the processor) gives back exactly those ids."""
    server, tm = vl_server(vl, Script([10, 11, IM_END]))
    out = generate(server, held, list(images))
    assert out.token_ids == [10, 11, IM_END] and out.stop_reason == "stop"
    sent = tm.requests[0]
    assert list(sent.input_ids) == held and sent.image_data == images
    assert tm.scheduled == [held]  # the ids SGLang runs the model on are the ids the trainer trains on
    assert out.extra_fields["verl_ext_engine"]["prompt_tokens"] == len(held)


def test_non_canonical_image_prompt_is_refused_before_sending(vl: Any, images: list[Any], held: list[int]) -> None:
    from verl_ext.engines.sglang_images import ImagePromptRebuildError

    server, tm = vl_server(vl, Script([10, IM_END]))
    prompt = non_canonical(held)
    at = prompt.index(HEL)
    with pytest.raises(ImagePromptRebuildError, match=rf"at position {at} .*a non-canonical tokenization") as info:
        generate(server, prompt, list(images))
    assert f"[{HEL}, {LO}," in str(info.value) and "image_prompt_refused" in str(info.value)
    assert tm.requests == [] and tm.scheduled == []  # nothing reached SGLang


def test_mutation_without_the_guard_sglang_runs_other_ids(
    vl: Any, images: list[Any], held: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard is what stops it: with the check made to pass, the same request reaches SGLang, which runs the
    model on other ids than the prompt held (the logprobs would belong to them)."""
    from verl_ext.engines import sglang_server
    from verl_ext.engines.sglang_images import RebuildCheck

    monkeypatch.setattr(sglang_server, "compare_rebuild", lambda held, *a, **k: RebuildCheck(True, 0, 0, None, ""))
    server, tm = vl_server(vl, Script([10, IM_END]))
    prompt = non_canonical(held)
    generate(server, prompt, list(images))
    assert tm.scheduled[0] != prompt and tm.scheduled[0] == held  # SGLang re-encoded " hello" canonically


def test_a_placeholder_count_sglang_expands_otherwise_is_refused(vl: Any, images: list[Any], held: list[int]) -> None:
    """SGLang's own image settings (its mm_process_config, here a pixel limit of 56x56) shrink the 56x112 image to
    2 placeholders where the prompt holds 8: refused, naming the settings."""
    from verl_ext.engines.sglang_images import ImagePromptRebuildError

    limit = {"size": {"shortest_edge": 56 * 56, "longest_edge": 56 * 56}}
    server, tm = vl_server(vl, Script([10, IM_END]), image_config=limit)
    with pytest.raises(ImagePromptRebuildError, match="another number of placeholder tokens.*mm_process_config"):
        generate(server, held, list(images))
    assert tm.requests == []


@pytest.mark.parametrize("count", [1, 3])
def test_images_not_one_per_placeholder_run_are_refused(
    vl: Any, images: list[Any], held: list[int], count: int
) -> None:
    from verl_ext.engines.sglang_images import ImagePromptRebuildError

    server, tm = vl_server(vl, Script([10, IM_END]))
    given = (images * 2)[:count]
    with pytest.raises(ImagePromptRebuildError, match=rf"2 image placeholder run\(s\).*but {count} image"):
        generate(server, held, given)
    assert tm.requests == []


def test_images_need_the_legacy_path_of_skip_tokenizer_init(vl: Any, images: list[Any], held: list[int]) -> None:
    from verl_ext.engines.sglang_images import ImagePromptRebuildError

    server, tm = vl_server(vl, Script([10, IM_END]), skip_tokenizer_init=False)
    with pytest.raises(ImagePromptRebuildError, match="skip_tokenizer_init=True"):
        generate(server, held, list(images))
    assert tm.requests == []


def test_images_for_a_model_sglang_serves_as_text_are_refused(images: list[Any], held: list[int]) -> None:
    from test_sglang_server import make_server

    from verl_ext.engines.sglang_images import ImagePromptRebuildError
    from verl_ext.engines.sglang_server import TokenExactSGLangServer

    load_sglang()
    tm = ScriptedTokenizerManager({IM_END}, VOCAB, [Script([10, IM_END])])
    server = make_server(TokenExactSGLangServer, tm)
    server.config.prompt_length = 512
    with pytest.raises(ImagePromptRebuildError, match="serves this model as text-only"):
        generate(server, held, list(images))
    assert tm.requests == []


@pytest.mark.parametrize("with_images", [True, False], ids=["image-prompt", "text-prompt"])
def test_placeholders_are_never_sampled(vl: Any, images: list[Any], held: list[int], with_images: bool) -> None:
    """A model that prefers <|image_pad|> then <|video_pad|> at the first step gets its third choice: SGLang's own
    logit bias bans both on every request to a multimodal model (verl's SGLang server bans neither)."""
    server, tm = vl_server(vl, Script(prefer=[[IMAGE_PAD, VIDEO_PAD, 10], [IM_END]]))
    prompt = held if with_images else [151644, 872, 198, HELLO, 151645, 198, 151644, 77091, 198]
    out = generate(server, prompt, list(images) if with_images else None)
    assert out.token_ids == [10, IM_END]
    bias = tm.requests[0].sampling_params["logit_bias"]
    assert bias == {str(IMAGE_PAD): float("-inf"), str(VIDEO_PAD): float("-inf")}


def test_mutation_without_the_ban_the_placeholder_is_sampled(
    vl: Any, images: list[Any], held: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl_ext.engines import sglang_server

    monkeypatch.setattr(sglang_server, "placeholder_ids", lambda mm: ())
    server, _ = vl_server(vl, Script(prefer=[[IMAGE_PAD, 10], [IM_END]]))
    out = generate(server, held, list(images))
    assert out.token_ids == [IMAGE_PAD, IM_END]


def test_a_callers_logit_bias_is_kept_beside_the_ban(vl: Any, images: list[Any], held: list[int]) -> None:
    server, tm = vl_server(vl, Script([10, IM_END]))
    generate(server, held, list(images), {**PARAMS, "max_tokens": 8, "logit_bias": {"10": 2.0}})
    assert tm.requests[0].sampling_params["logit_bias"] == {
        "10": 2.0,
        str(IMAGE_PAD): float("-inf"),
        str(VIDEO_PAD): float("-inf"),
    }


def test_the_gpu_scripts_vl_arm_server_forces_the_screenshot_then_serves_the_image_turn(
    vl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The VL arm's server (tests/gpu/run_sglang_grpo.py --arms verl_ext_vl): the forced screenshot call is scored
    by SGLang (no image yet), the next turn carries the screenshot through the image path (proven, banned)."""
    import importlib.util

    from test_sglang_server import make_server

    from verl_ext.engines.forced_turn import SGLANG_FORCE_ENV
    from verl_ext.engines.sglang_server import ForcedFirstTurnTokenExactSGLangServer

    spec = importlib.util.spec_from_file_location(
        "run_sglang_grpo", Path(__file__).parents[1] / "gpu" / "run_sglang_grpo.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)  # its dataclasses look their module up there
    spec.loader.exec_module(script)
    monkeypatch.setenv(SGLANG_FORCE_ENV, script.FORCED_SCREENSHOT_CALL)
    mm = sglang_mm_processor(vl, vl.config)
    tm = ScriptedTokenizerManager({IM_END, ENDOFTEXT}, VOCAB, [Script([5]), Script([10, IM_END])], mm_processor=mm)
    server = make_server(ForcedFirstTurnTokenExactSGLangServer, tm)
    server.model_config.tokenizer = vl.tokenizer
    server.config.prompt_length = server.config.response_length = 512
    server.config.mtp = None
    user = [{"role": "user", "content": [{"type": "text", "text": "Take a screenshot."}]}]
    first_text = vl.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    prompt = [int(i) for i in vl(text=[first_text], return_tensors="np")["input_ids"][0]]
    first = generate(server, prompt, None, {**PARAMS, "max_tokens": 64})
    forced = vl.tokenizer.encode(script.FORCED_SCREENSHOT_CALL, add_special_tokens=False)
    assert first.token_ids == forced and tm.requests[0].image_data is None
    shot = make_image(112, 56, 3)
    call = {"role": "assistant", "content": script.FORCED_SCREENSHOT_CALL.removesuffix("<|im_end|>")}
    result = {"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": "screenshot of the top"}]}
    messages = [*user, call, result]
    text = vl.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    second = [int(i) for i in vl(text=[text], images=[shot], return_tensors="np")["input_ids"][0]]
    assert second[: len(prompt) + len(forced)] == prompt + forced
    out = generate(server, second, [shot])
    assert out.token_ids == [10, IM_END] and tm.scheduled[1] == second
    assert tm.requests[1].sampling_params["logit_bias"][str(IMAGE_PAD)] == float("-inf")
