"""The loop's trainer sample for a rollout with images: a response-length cut inside an image's block moves before
the block, the trainer's images are the ones whose runs it keeps, and the check passes."""

from __future__ import annotations

from typing import Any

from vl_rollouts import drive, make_image

from verl_ext.check.checker import ConsistencyChecker
from verl_ext.check.image_view import placeholder_runs
from verl_ext.check.record import Rollout
from verl_ext.core.images import ImageTokens
from verl_ext.core.rendering import ChatRenderer
from verl_ext.plugin.image_loop import image_sample


def test_a_cut_inside_an_image_moves_before_its_block(vl_renderer: ChatRenderer, image_tokens: ImageTokens) -> None:
    ro = drive(vl_renderer, image_tokens, [make_image(100, 100, 1)], [[make_image(140, 140, 2)]])
    t = ro.trajectory
    last = t.image_spans[1]  # the tool result's image: after the first engine call
    first_prompt = t.turns[0].prompt_length
    response_length = last.position + 5 - first_prompt  # the trainer's cap cuts its run after 5 of its tokens
    got = image_sample(t, response_length)
    stream = got.sample.stream
    assert len(stream) == last.position - 1  # before <|vision_start|>
    assert placeholder_runs(stream, image_tokens.profile.placeholder_id) == [(t.image_spans[0].position, 16)]
    assert got.multi_modal_data == {"images": [t.images[0]]}
    rollout = Rollout.of(
        ro.calls[:1],
        got.sample,
        got.record_messages[:3],
        t.tools,
        prompt_messages=1,
        response_length=response_length,
        extra={"images": got.record_images},
    )
    result = ConsistencyChecker(vl_renderer).check_rollout(rollout, template_view=False)
    assert result.engine_ok, result.engine_failures


def test_without_a_cut_every_image_goes_to_the_trainer(vl_renderer: ChatRenderer, image_tokens: ImageTokens) -> None:
    ro = drive(vl_renderer, image_tokens, [make_image(56, 56, 1)], [[make_image(56, 112, 2), make_image(20, 20, 3)]])
    got: Any = image_sample(ro.trajectory, None)
    assert got.multi_modal_data == {"images": ro.trajectory.images}
    assert got.sample == ro.sample()


def test_a_tool_results_text_is_capped_and_its_images_kept() -> None:
    import types

    from verl_ext.plugin.agent_loop import VerlExtToolAgentLoop
    from verl_ext.plugin.image_loop import tool_message
    from verl_ext.plugin.tool_calls import ToolOutcome, ToolStatus

    image = make_image(56, 56)
    message = tool_message({"role": "tool", "content": "x" * 50, "tool_call_id": "c0"}, [image])
    loop = types.SimpleNamespace(max_tool_response_length=10, tool_response_truncate_side="right")
    loop._cap_response = types.MethodType(VerlExtToolAgentLoop._cap_response, loop)
    capped = loop._cap_response(ToolOutcome(message, ToolStatus.OK, None))
    assert capped.message["content"] == [
        {"type": "image", "image": image},
        {"type": "text", "text": "x" * 10 + "...(truncated)"},
    ]
    assert capped.message["tool_call_id"] == "c0"
