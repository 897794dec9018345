"""Pieces of the image tests: a tool that returns screenshots, test images, and VL rollouts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl_ext.check.image_view import image_evidence, messages_for_record
from verl_ext.check.inputs import EngineCall, EngineCalls, TrainerSample, trainer_sample_from_trajectory
from verl_ext.check.record import Rollout
from verl_ext.core.image_trajectory import ImageTrajectory
from verl_ext.core.images import ImageTokens
from verl_ext.core.rendering import ChatRenderer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "screenshot",
            "description": "Take a screenshot of the screen.",
            "parameters": {"type": "object", "properties": {"region": {"type": "string"}}},
        },
    }
]


def make_image(width: int, height: int, seed: int = 0) -> Any:
    """An RGB test image whose pixels depend on its size and ``seed`` (distinct images, distinct digests)."""
    from PIL import Image

    img = Image.new("RGB", (width, height), ((width * 7 + seed) % 256, (height * 13 + seed * 3) % 256, seed % 256))
    img.putpixel((0, 0), (seed % 256, 1, 2))
    return img


CALL_TEXT = '<tool_call>\n{{"name": "screenshot", "arguments": {{"region": "{region}"}}}}\n</tool_call><|im_end|>'


def call_message(region: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "screenshot", "arguments": {"region": region}}}],
    }


def image_parts(images: list[Any], text: str) -> list[dict[str, Any]]:
    return [*({"type": "image", "image": im} for im in images), {"type": "text", "text": text}]


@dataclass
class VLRollout:
    """A driven image rollout: the trajectory, its engine calls, and the images handed to the trainer."""

    trajectory: ImageTrajectory
    calls: list[EngineCall]  # each with the digests of the images it was given (EngineCalls.record's images)
    images: list[Any]

    def sample(self) -> TrainerSample:
        return trainer_sample_from_trajectory(self.trajectory)

    def rollout(
        self,
        sample: TrainerSample | None = None,
        images: list[Any] | None = None,
        calls: list[EngineCall] | None = None,
    ) -> Rollout:
        """The check's ``Rollout`` (``sample``, the trainer's ``images`` or the engine ``calls`` replaced to inject
        a defect)."""
        t = self.trajectory
        evidence = image_evidence(t, self.images if images is None else images)
        return Rollout.of(
            self.calls if calls is None else calls,
            sample or self.sample(),
            messages_for_record(t.messages, t.image_spans),
            t.tools,
            prompt_messages=1,
            kinds=[k.value for k in t.kinds],
            extra={"images": evidence.to_json()},
        )


def drive(
    renderer: ChatRenderer, tokens: ImageTokens, prompt_images: list[Any], tool_images: list[list[Any]]
) -> VLRollout:
    """A screenshot-tool rollout: the prompt with ``prompt_images``, one tool call per entry of ``tool_images``
    (each result holding those images), then a final answer. Each engine call is recorded with the images a loop
    passes with it (every image of the prompt, in placeholder order)."""
    t = ImageTrajectory(renderer, image_tokens=tokens)
    calls = EngineCalls()
    prompt = t.start([{"role": "user", "content": image_parts(prompt_images, "What is on the screen?")}], TOOLS)
    turns = [(CALL_TEXT.format(region=f"r{k}"), call_message(f"r{k}")) for k in range(len(tool_images))]
    turns.append(("It shows a screen.<|im_end|>", {"role": "assistant", "content": "It shows a screen."}))
    for k, (text, message) in enumerate(turns):
        out = renderer.encode(text)
        logprobs = [-0.01 * (k + 1)] * len(out)
        calls.record(prompt, out, logprobs, "stop", images=list(t.images))
        t.add_sampled(out, logprobs, "stop", message)
        if k < len(tool_images):
            tool = {"role": "tool", "content": image_parts(tool_images[k], f"screenshot {k}")}
            prompt = t.append_messages([tool])
    t.finish()
    return VLRollout(t, list(calls), list(t.images))


class ImageRecordingServer:
    """verl's server-manager interface over an in-process CPU server; records each call's prompt, images, output."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.requests: list[dict[str, Any]] = []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], image_data: Any = None
    ) -> Any:
        request = {"prompt_ids": list(prompt_ids), "images": list(image_data or [])}
        self.requests.append(request)
        out = await self.server.generate(prompt_ids, sampling_params, request_id, image_data=image_data)
        request["output_ids"] = list(out.token_ids)
        return out


def verl_vl_config(tiny_vl_dir: Any, response_length: int, *overrides: str) -> Any:
    """verl's own trainer config (``ppo_trainer``, composed as main_ppo composes it) for the tiny VL model, multi-turn
    hermes, a 512-token prompt and ``response_length``; ``overrides`` after."""
    from pathlib import Path

    import verl.trainer
    from hydra import compose, initialize_config_dir

    base = [
        f"actor_rollout_ref.model.path={tiny_vl_dir}",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.prompt_length=512",
        f"actor_rollout_ref.rollout.response_length={response_length}",
    ]
    with initialize_config_dir(config_dir=str(Path(verl.trainer.__file__).parent / "config"), version_base=None):
        return compose(config_name="ppo_trainer", overrides=[*base, *overrides])


def verl_trainer_inputs(processor: Any, out: Any, stream: list[int]) -> tuple[Any, Any]:
    """What verl's worker computes for the trainer from an agent loop's output, with ``AgentLoopWorker``'s own
    functions: ``multi_modal_inputs`` and the position ids."""
    import types

    import torch
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    worker = types.SimpleNamespace(processor=processor, tokenizer=processor.tokenizer, mm_processor_kwargs={})
    worker._get_mm_processor_kwargs = types.MethodType(AgentLoopWorker._get_mm_processor_kwargs, worker)
    ids = torch.tensor([stream])
    mm = AgentLoopWorker._compute_multi_modal_inputs(worker, out, ids)
    return mm, AgentLoopWorker._compute_position_ids(worker, ids, torch.ones_like(ids), mm)


def assert_each_call_recorded_its_images(line: dict[str, Any], digests: list[str]) -> None:
    """A record of two engine calls given one image, then the same plus one: each call's images are recorded (as
    kept + added digests) and the image view compared them with its prompt's placeholder runs."""
    assert [c["images"] for c in line["engine_calls"]][:2] == [
        {"kept": 0, "added": digests[:1]},
        {"kept": 1, "added": digests[1:]},
    ]
    assert line["check"]["image_calls_unchecked"] == ""
