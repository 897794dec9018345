"""verl_ext_tool_agent with a vision-language model, in process (no Ray): verl's config and tool loader, the CPU
engine serving a tiny random Qwen2.5-VL, a tool that answers with screenshots. The engine gets every image in
placeholder order, the trainer gets them as multi_modal_data, the check's every view passes, and verl's own worker
functions compute multi_modal_inputs and mrope position_ids from the output."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
from vl_rollouts import make_image

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT_TOOL = REPO / "verl_ext" / "demo" / "screenshot_tool.py"
CALL = '<tool_call>\n{"name": "screenshot", "arguments": {"region": "bottom"}}\n</tool_call><|im_end|>'


def _loop(tiny_vl_dir: Path, processor: Any, tmp_path: Path, response_length: int = 160) -> tuple[Any, Any]:
    import verl.trainer
    from hydra import compose, initialize_config_dir
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.tools.function_tool import load_function_tools_from_path
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.engines.cpu import CPUGenerationServer
    from verl_ext.plugin.agent_loop import VerlExtToolAgentLoop

    overrides = [
        f"actor_rollout_ref.model.path={tiny_vl_dir}",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "actor_rollout_ref.rollout.prompt_length=512",
        f"actor_rollout_ref.rollout.response_length={response_length}",
    ]
    with initialize_config_dir(config_dir=str(Path(verl.trainer.__file__).parent / "config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)  # verl's own config, as main_ppo composes it
    server = ImageRecordingServer(
        CPUGenerationServer(str(tiny_vl_dir), prompt_length=512, response_length=response_length, force_text=CALL)
    )
    loop = VerlExtToolAgentLoop(
        trainer_config=DictConfigWrap(cfg),
        server_manager=server,
        tokenizer=processor.tokenizer,
        processor=processor,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap(load_function_tools_from_path(str(SCREENSHOT_TOOL))),
        hf_model_type="qwen2_5_vl",
        verl_ext={"records": {"dir": str(tmp_path)}},
    )
    return loop, server


class ImageRecordingServer:
    """The harness's recording server, with the images of each call."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.requests: list[dict[str, Any]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, image_data: Any = None):
        self.requests.append({"prompt_ids": list(prompt_ids), "images": list(image_data or [])})
        return await self.server.generate(prompt_ids, sampling_params, request_id, image_data=image_data)


def _run(loop: Any, prompt: list[dict[str, Any]]) -> Any:
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    return loop.loop.run_until_complete(loop.run(params, raw_prompt=prompt))


def test_screenshot_tool_images_reach_engine_and_trainer(tiny_vl_dir: Path, vl_processor: Any, tmp_path: Path) -> None:
    loop, server = _loop(tiny_vl_dir, vl_processor, tmp_path)
    first = make_image(100, 100, 1)
    prompt = [{"role": "user", "content": [{"type": "image", "image": first}, {"type": "text", "text": "Look."}]}]
    out = _run(loop, prompt)
    verdict = out.extra_fields["verl_ext_check"]
    assert verdict["ok"], verdict
    images = out.multi_modal_data["images"]
    assert len(images) == 2 and images[0] is first and images[1].size == (56, 112)  # the tool's "bottom" screen
    # the engine got the images so far with each call: one, then both
    assert [len(r["images"]) for r in server.requests][:2] == [1, 2]
    pad = vl_processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    stream = out.prompt_ids + out.response_ids
    assert stream.count(pad) == 16 + 8  # 100x100 -> 16 pads, 56x112 -> 8
    assert all(m == 0 for t, m in zip(out.response_ids, out.response_mask, strict=True) if t == pad)
    line = json.loads((next(tmp_path.glob("*.jsonl"))).read_text().splitlines()[-1])
    assert [s["length"] for s in line["images"]["engine"]] == [16, 8]
    assert line["messages"][0]["content"][0] == {
        "type": "image",
        "digest": line["images"]["engine"][0]["digest"],
        "tokens": 16,
    }
    # each engine call's record holds the images it was given (the first call one, the second the same plus one),
    # and the image view compared each call's with its prompt's placeholder runs
    digests = [s["digest"] for s in line["images"]["engine"]]
    assert [c["images"] for c in line["engine_calls"]][:2] == [
        {"kept": 0, "added": digests[:1]},
        {"kept": 1, "added": digests[1:]},
    ]
    assert line["check"]["image_calls_unchecked"] == ""
    # verl's worker computes the trainer's inputs from this output (AgentLoopWorker's own functions)
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    worker = types.SimpleNamespace(processor=vl_processor, tokenizer=vl_processor.tokenizer, mm_processor_kwargs={})
    worker._get_mm_processor_kwargs = types.MethodType(AgentLoopWorker._get_mm_processor_kwargs, worker)
    import torch

    ids = torch.tensor([stream])
    mm = AgentLoopWorker._compute_multi_modal_inputs(worker, out, ids)
    assert mm["image_grid_thw"].tolist() == [[1, 8, 8], [1, 8, 4]]
    positions = AgentLoopWorker._compute_position_ids(worker, ids, torch.ones_like(ids), mm)
    assert tuple(positions.shape) == (1, 4, len(stream))


def test_an_engine_call_given_its_images_swapped_is_caught(
    tiny_vl_dir: Path, vl_processor: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The defect: the loop hands the engine a call's images in another order. The CPU engine (as verl's own count
    check) only compares the total placeholder count, so it serves the call; the image view names the call."""
    import verl_ext.plugin.agent_loop as agent_loop

    real_turn = agent_loop.generate_turn

    async def swapping_turn(*args: Any, image_data: list[Any] | None = None, **kwargs: Any) -> Any:
        return await real_turn(*args, image_data=None if image_data is None else image_data[::-1], **kwargs)

    monkeypatch.setattr(agent_loop, "generate_turn", swapping_turn)
    loop, server = _loop(tiny_vl_dir, vl_processor, tmp_path)
    prompt = [
        {
            "role": "user",
            "content": [{"type": "image", "image": make_image(100, 100, 1)}, {"type": "text", "text": "Look."}],
        }
    ]
    out = _run(loop, prompt)
    assert [len(r["images"]) for r in server.requests][:2] == [1, 2]  # the engine served the swapped call
    verdict = out.extra_fields["verl_ext_check"]
    assert not verdict["engine_ok"], verdict
    line = json.loads((next(tmp_path.glob("*.jsonl"))).read_text().splitlines()[-1])
    kinds = {(f["kind"], f["turn"]) for f in line["check"]["engine_failures"]}
    assert ("image_engine_mismatch", 1) in kinds, line["check"]["engine_failures"]


def test_images_for_a_text_only_model_are_refused(tiny_vl_dir: Path, vl_processor: Any, tmp_path: Path) -> None:
    from verl_ext.core.errors import OptionsError

    loop, _ = _loop(tiny_vl_dir, vl_processor, tmp_path)
    loop.processor = None  # verl gives no processor: a text-only model
    prompt = [
        {"role": "user", "content": [{"type": "image", "image": make_image(56, 56)}, {"type": "text", "text": "x"}]}
    ]
    with pytest.raises(OptionsError, match="holds images but the model has no image processor"):
        _run(loop, prompt)
