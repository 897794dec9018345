"""verl_ext_tool_agent with a vision-language model, in process (no Ray): verl's config and tool loader, the CPU
engine serving a tiny random Qwen2.5-VL, a tool that answers with screenshots. The engine gets every image in
placeholder order, the trainer gets them as multi_modal_data, the check's every view passes, and verl's own worker
functions compute multi_modal_inputs and mrope position_ids from the output."""

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

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT_TOOL = REPO / "verl_ext" / "demo" / "screenshot_tool.py"
CALL = '<tool_call>\n{"name": "screenshot", "arguments": {"region": "bottom"}}\n</tool_call><|im_end|>'


def _loop(
    tiny_vl_dir: Path,
    processor: Any,
    tmp_path: Path,
    response_length: int = 160,
    tools: Path = SCREENSHOT_TOOL,
    force: str = CALL,
) -> tuple[Any, Any]:
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.tools.function_tool import load_function_tools_from_path
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.engines.cpu import CPUGenerationServer
    from verl_ext.plugin.agent_loop import VerlExtToolAgentLoop

    cfg = verl_vl_config(tiny_vl_dir, response_length, "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3")
    server = ImageRecordingServer(
        CPUGenerationServer(str(tiny_vl_dir), prompt_length=512, response_length=response_length, force_text=force)
    )
    loop = VerlExtToolAgentLoop(
        trainer_config=DictConfigWrap(cfg),
        server_manager=server,
        tokenizer=processor.tokenizer,
        processor=processor,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap(load_function_tools_from_path(str(tools))),
        hf_model_type="qwen2_5_vl",
        verl_ext={"records": {"dir": str(tmp_path)}},
    )
    return loop, server


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
    # each distinct image got one thumbnail beside the records, named by its digest (the report shows it by its span)
    digests = sorted({s["digest"] for s in line["images"]["engine"]})
    assert sorted(p.stem for p in (tmp_path / "thumbnails").iterdir()) == digests and len(digests) == 2
    assert line["messages"][0]["content"][0] == {
        "type": "image",
        "digest": line["images"]["engine"][0]["digest"],
        "tokens": 16,
    }
    # each engine call's record holds the images it was given (the first call one, the second the same plus one)
    assert_each_call_recorded_its_images(line, [s["digest"] for s in line["images"]["engine"]])
    # verl's worker computes the trainer's inputs from this output (AgentLoopWorker's own functions)
    mm, positions = verl_trainer_inputs(vl_processor, out, stream)
    assert mm["image_grid_thw"].tolist() == [[1, 8, 8], [1, 8, 4]]
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


@pytest.mark.parametrize(
    ("kind", "cause"),
    [
        ("bytes", "cannot be decoded as an image"),
        ("path", "is not a file"),
        ("url", "the loop fetches no images"),
        ("obj", "a float is not an image"),
    ],
)
def test_a_tool_image_the_processor_cannot_read_is_the_tools_failure(
    kind: str, cause: str, tiny_vl_dir: Path, vl_processor: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a crashed step, not a dropped image: the model is told the tool failed, ``tito/tool/bad_image`` counts
    it, and the rollout checks clean."""
    from verl_ext.plugin import metrics_sink

    monkeypatch.setenv("UNUSABLE_IMAGE", kind)
    metrics_sink.drain()
    tools = Path(__file__).parent / "unusable_image_tool.py"
    call = CALL.replace('"screenshot"', '"screen_capture"')  # verl registers function tools by name, once
    loop, server = _loop(tiny_vl_dir, vl_processor, tmp_path, tools=tools, force=call)
    parts = [{"type": "image", "image": make_image(56, 56)}, {"type": "text", "text": "x"}]
    prompt = [{"role": "user", "content": parts}]
    out = _run(loop, prompt)
    assert out.extra_fields["verl_ext_check"]["ok"]
    assert out.multi_modal_data["images"] == [prompt[0]["content"][0]["image"]]  # the prompt's image only
    assert len(server.requests) >= 2 and all(len(r["images"]) == 1 for r in server.requests)
    line = json.loads(next(tmp_path.glob("*.jsonl")).read_text().splitlines()[-1])
    tool_message = next(m for m in line["messages"] if m["role"] == "tool")
    assert "answered with an unusable image" in tool_message["content"] and cause in tool_message["content"]
    assert metrics_sink.drain()["tito/tool/bad_image"] == 1


def test_prompt_images_are_decoded_and_a_bad_one_is_refused_naming_it(
    tiny_vl_dir: Path, vl_processor: Any, tmp_path: Path
) -> None:
    import io

    from verl_ext.core.errors import OptionsError

    loop, server = _loop(tiny_vl_dir, vl_processor, tmp_path)
    buffer = io.BytesIO()
    make_image(100, 100, 2).save(buffer, format="PNG")
    # verl's images column may hold a file's bytes or a path: decoded once, so the engine, the trainer and the
    # record's digest all see one Pillow image
    prompt = [
        {"role": "user", "content": [{"type": "image", "image": buffer.getvalue()}, {"type": "text", "text": "x"}]}
    ]
    out = _run(loop, prompt)
    assert out.extra_fields["verl_ext_check"]["ok"]
    first = out.multi_modal_data["images"][0]
    assert first.size == (100, 100) and server.requests[0]["images"][0] is first
    bad = [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image", "image": b"\x89PNG cut"}]}]
    with pytest.raises(OptionsError, match=r"messages\[0\]\.content\[1\] is not a usable image: the bytes cannot"):
        _run(loop, bad)


def test_an_image_prompt_the_sglang_server_refuses_ends_the_rollout_before_that_turn(
    tiny_vl_dir: Path, vl_processor: Any, tmp_path: Path
) -> None:
    """verl_ext's SGLang server refuses a turn whose image prompt SGLang would rebuild to other ids
    (tests/engines/test_sglang_server_images.py); the loop ends the rollout before that turn, keeps its exact
    earlier turns (the check passes) and counts it."""
    from verl_ext.engines.sglang_images import ImagePromptRebuildError
    from verl_ext.plugin import metrics_sink

    metrics_sink.drain()
    loop, server = _loop(tiny_vl_dir, vl_processor, tmp_path)
    inner = server.generate

    async def refusing(request_id: str, **kw: Any) -> Any:
        if kw.get("image_data"):  # the turn after the screenshot: the server refuses it, nothing is sampled
            server.requests.append({"refused": True})
            raise ImagePromptRebuildError("request r: ... a non-canonical tokenization ...")
        return await inner(request_id, **kw)

    loop.server_manager.generate = refusing
    out = _run(loop, [{"role": "user", "content": "Take a screenshot."}])
    verdict = out.extra_fields["verl_ext_check"]
    assert verdict["ok"], verdict
    assert server.requests[-1] == {"refused": True} and len(server.requests) == 2
    pad = vl_processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert out.response_ids.count(pad) == 8 and out.response_mask[-1] == 0  # ends on the screenshot's tool result
    assert out.multi_modal_data["images"][0].size == (56, 112)
    assert metrics_sink.drain().get("tito/engine/image_prompt_refused") == 1.0
