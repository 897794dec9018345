"""verl_ext_gateway_agent with a vision-language model, in process (no Ray): verl's config, verl's processor as the
loop's ``processor``, the CPU engine serving the tiny random Qwen2.5-VL as verl's server manager, and a harness on the
real OpenAI SDK sending ``image_url`` data URLs in the prompt and in a tool result. The engine gets every image of
the prompt in placeholder order with each call, the trainer gets the images as ``multi_modal_data``, the check's
image view passes, and verl's own worker functions compute multi_modal_inputs and mrope position ids from the
output. A dropped image is caught: by the check where the trainer's images lack it, by the engine where its call
does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from vl_rollouts import (
    ImageRecordingServer,
    assert_each_call_recorded_its_images,
    make_image,
    verl_trainer_inputs,
    verl_vl_config,
)

from verl_ext.core.images import image_digest
from verl_ext.plugin import metrics_sink

SHOT = '<tool_call>\n{"name": "screenshot", "arguments": {"region": "top"}}\n</tool_call><|im_end|>'
PAD = "<|image_pad|>"


@pytest.fixture(scope="module")
def vl_server(tiny_vl_dir: Path) -> Any:
    """The CPU engine on the tiny VL model, loaded once; every trajectory's first turn is a screenshot call."""
    from verl_ext.engines.cpu import CPUGenerationServer

    return CPUGenerationServer(str(tiny_vl_dir), prompt_length=512, response_length=160, force_text=SHOT)


@pytest.fixture
def gateway_vl_loop(tiny_vl_dir: Path, vl_processor: Any, vl_server: Any, tmp_path: Path) -> Any:
    """``make()`` -> (verl_ext_gateway_agent loop, its recording server); records under tmp_path/records."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.plugin.gateway_loop import VerlExtGatewayAgentLoop

    cfg = verl_vl_config(tiny_vl_dir, 160)

    def make() -> tuple[Any, ImageRecordingServer]:
        server = ImageRecordingServer(vl_server)
        loop = VerlExtGatewayAgentLoop(
            trainer_config=DictConfigWrap(cfg),
            server_manager=server,
            tokenizer=vl_processor.tokenizer,
            processor=vl_processor,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data),
            tools=ToolListWrap([]),  # the harness brings its own tools
            hf_model_type="qwen2_5_vl",
            verl_ext={"records": {"dir": str(tmp_path / "records")}},
            harness={"function": "vl_harness:screenshot_agent", "timeout_s": 120},
        )
        return loop, server

    return make


def _run(loop: Any, prompt: list[dict[str, Any]], **row: Any) -> Any:
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    return loop.loop.run_until_complete(loop.run(params, raw_prompt=prompt, **row))


def _prompt(*images: Any) -> list[dict[str, Any]]:
    """A verl dataset prompt (``RLHFDataset`` writes image parts holding the image) with ``images`` before the text."""
    parts = [*({"type": "image", "image": im} for im in images), {"type": "text", "text": "What is on the screen?"}]
    return [{"role": "user", "content": parts}]


def _rollout_lines(tmp_path: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for f in (tmp_path / "records").glob("*.jsonl") for line in f.read_text().splitlines()]
    return [line for line in lines if line.get("type") == "rollout"]


def test_gateway_agent_hands_engine_and_trainer_every_image(
    gateway_vl_loop: Any, vl_processor: Any, tmp_path: Path
) -> None:
    metrics_sink.drain()
    loop, server = gateway_vl_loop()
    first, screen = make_image(100, 100, 1), make_image(56, 112, 2)
    out = _run(loop, _prompt(first), screen=screen)
    assert out.extra_fields["harness_result"] is not None, out.extra_fields["verl_ext_gateway"]  # the harness ran
    assert out.extra_fields["harness_result"]["calls"] == 1  # one screenshot call, answered with an image
    verdict = out.extra_fields["verl_ext_check"]
    assert verdict["ok"], verdict
    sent = [image_digest(first), image_digest(screen)]  # the harness sent PNG data URLs: the gateway decoded them

    # the engine got every image of each prompt, in placeholder order, with each call: one, then both
    assert [[image_digest(i) for i in r["images"]] for r in server.requests] == [sent[:1], sent]
    # the trainer gets the same images in the same order, with the ids holding each one's expanded run
    assert [image_digest(i) for i in out.multi_modal_data["images"]] == sent
    pad = vl_processor.tokenizer.convert_tokens_to_ids(PAD)
    stream = out.prompt_ids + out.response_ids
    from verl_ext.check.image_view import placeholder_runs

    runs = placeholder_runs(stream, pad)
    assert [n for _, n in runs] == [16, 8]  # 100x100 -> grid [1, 8, 8] -> 16; 56x112 -> [1, 8, 4] -> 8
    assert stream[: len(server.requests[1]["prompt_ids"])] == server.requests[1]["prompt_ids"]  # the engine's ids
    start = len(out.prompt_ids)
    assert runs[1][0] >= start  # the tool result's image is in the response, none of it trained
    assert out.response_mask[runs[1][0] - start : runs[1][0] - start + 8] == [0] * 8
    assert sum(out.response_mask) == sum(len(r["output_ids"]) for r in server.requests)
    m = metrics_sink.drain()
    assert m["tito/rollouts_checked"] == 1 and m["tito/engine_view_failures"] == 0

    # the record holds the image view's evidence: the trainer's digests are those of the images handed to verl
    (line,) = _rollout_lines(tmp_path)
    assert [s["digest"] for s in line["images"]["trainer"]] == sent
    assert [(s["position"], s["length"]) for s in line["images"]["engine"]] == runs
    # and each engine call's images, as passed to verl's server manager: compared with its prompt's runs
    assert_each_call_recorded_its_images(line, sent)
    # verl's worker computes the trainer's inputs from this output (AgentLoopWorker's own functions)
    mm, positions = verl_trainer_inputs(vl_processor, out, stream)
    assert mm["image_grid_thw"].tolist() == [[1, 8, 8], [1, 8, 4]]
    assert tuple(positions.shape) == (1, 4, len(stream))


def test_an_image_dropped_for_the_trainer_or_the_engine_is_caught(
    gateway_vl_loop: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    import verl_ext.plugin.gateway_loop as gateway_loop
    import verl_ext.runtime.rollout as rollout
    from verl_ext.check.image_view import image_evidence

    real_sample = rollout.image_sample  # where every rollout's trainer sample with images is cut

    def dropping_sample(t: Any, response_length: int | None) -> Any:
        """The defect: the trainer is handed the branch's images less the last (the evidence is of what it gets)."""
        cut = real_sample(t, response_length)
        handed = cut.multi_modal_data["images"][:-1]
        evidence = dataclasses.replace(image_evidence(t, handed), engine=tuple(t.image_spans))
        return dataclasses.replace(cut, multi_modal_data={"images": handed}, record_images=evidence.to_json())

    metrics_sink.drain()
    loop, _ = gateway_vl_loop()
    monkeypatch.setattr(rollout, "image_sample", dropping_sample)
    out = _run(loop, _prompt(make_image(100, 100, 1)), screen=make_image(56, 112, 2))
    assert not out.extra_fields["verl_ext_check"]["engine_ok"]
    m = metrics_sink.drain()
    assert m["tito/engine_view_failures"] == 1 and m["tito/engine_view/image_dropped"] == 1
    monkeypatch.undo()

    # the defect on the engine's side, one the engine serves: a call given its images swapped (the CPU engine, as
    # verl's own check, compares only the total placeholder count); the image view names the call
    real_turn = gateway_loop.generate_turn

    async def swapping_turn(*args: Any, image_data: list[Any] | None = None, **kwargs: Any) -> Any:
        return await real_turn(*args, image_data=None if image_data is None else image_data[::-1], **kwargs)

    monkeypatch.setattr(gateway_loop, "generate_turn", swapping_turn)
    out = _run(loop, _prompt(make_image(100, 100, 1)), screen=make_image(56, 112, 2))
    assert not out.extra_fields["verl_ext_check"]["engine_ok"]
    m = metrics_sink.drain()
    assert m["tito/engine_view/image_engine_mismatch"] == 1, m
    monkeypatch.undo()

    # the defect on the engine's side: a call given one image fewer than its prompt's placeholder runs is refused
    # by the engine, the harness gets the error, and nothing of the rollout is trained
    async def dropping_turn(*args: Any, image_data: list[Any] | None = None, **kwargs: Any) -> Any:
        return await real_turn(*args, image_data=(image_data or [])[:-1] or None, **kwargs)

    monkeypatch.setattr(gateway_loop, "generate_turn", dropping_turn)
    out = _run(loop, _prompt(make_image(100, 100, 1)), screen=make_image(56, 112, 2))
    assert sum(out.response_mask) == 0
    failed = out.extra_fields["verl_ext_gateway"]["failed"]
    assert "the harness raised InternalServerError" in failed, failed
    assert "the prompt holds 16 image placeholder tokens but the request has no images" in failed, failed
    assert metrics_sink.drain()["tito/gateway/harness_failed"] == 1
    # the untrained sample still hands verl the prompt's image with its expanded run (its worker pairs them)
    assert len(out.multi_modal_data["images"]) == 1 and out.prompt_ids.count(151655) == 16


def test_without_a_processor_images_are_refused_naming_the_cause(gateway_vl_loop: Any) -> None:
    from verl_ext.core.errors import OptionsError

    loop, server = gateway_vl_loop()
    loop.processor = None  # verl gives no processor (its hf_processor without torchvision, or a text-only model)
    metrics_sink.drain()
    out = _run(loop, _prompt(), screen=make_image(56, 112, 2))  # a text prompt; the tool result holds an image
    failed = out.extra_fields["verl_ext_gateway"]["failed"]
    assert "400" in failed and "messages[2].content[0] is an image, but verl gives verl_ext_gateway_agent no " in failed
    assert sum(out.response_mask) == 0 and out.multi_modal_data is None
    assert all(not r["images"] for r in server.requests)
    with pytest.raises(OptionsError, match="the row's prompt holds images, but verl gives verl_ext_gateway_agent no"):
        _run(loop, _prompt(make_image(56, 56)), screen=make_image(56, 112, 2))
