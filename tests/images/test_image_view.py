"""The check's image view: each image defect is caught with its own failure kind; correct rollouts with images in
prompts and tool results (random sizes, 0-3 per message) pass with 0 defects."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vl_rollouts import drive, make_image

from verl_ext.check.checker import ConsistencyChecker
from verl_ext.check.findings import FailureKind
from verl_ext.check.image_view import placeholder_runs
from verl_ext.check.inputs import TrainerSample
from verl_ext.check.record import RolloutRecord
from verl_ext.core.images import ExpandedImage, ImageTokens
from verl_ext.core.rendering import ChatRenderer


@pytest.fixture(scope="module")
def checker(vl_renderer: ChatRenderer) -> ConsistencyChecker:
    return ConsistencyChecker(vl_renderer)


@pytest.fixture(scope="module")
def three_images(vl_renderer: ChatRenderer, image_tokens: ImageTokens) -> Any:
    """One prompt image, then a tool result with two (three grids: 16, 8 and 77 pads)."""
    first, tool = [make_image(100, 100, 1)], [make_image(56, 112, 2), make_image(300, 200, 3)]
    return drive(vl_renderer, image_tokens, first, [tool, []])


def kinds(result: Any) -> set[FailureKind]:
    return {f.kind for f in result.engine_failures}


def test_a_correct_rollout_with_images_passes_every_view(checker: ConsistencyChecker, three_images: Any) -> None:
    result = checker.check_rollout(three_images.rollout(), template_view=True)
    assert result.ok, result.summary()
    record = three_images.rollout().record(result)
    line = json.loads(json.dumps(record.to_json()))  # a record line: images as digests, spans in its extras
    assert [s["length"] for s in line["images"]["engine"]] == [16, 8, 77]
    assert RolloutRecord.from_json(line).extra["images"]["trainer"][2]["grid"] == [1, 14, 22]


def test_an_image_dropped_from_the_trainer_is_caught(checker: ConsistencyChecker, three_images: Any) -> None:
    images = three_images.images
    result = checker.check_rollout(three_images.rollout(images=[images[0], images[2]]))
    assert FailureKind.IMAGE_DROPPED in kinds(result)
    assert "image 1" in next(f.detail for f in result.engine_failures if f.kind is FailureKind.IMAGE_DROPPED)


def test_two_images_swapped_are_caught(checker: ConsistencyChecker, three_images: Any) -> None:
    a, b, c = three_images.images
    result = checker.check_rollout(three_images.rollout(images=[a, c, b]))
    assert kinds(result) >= {FailureKind.IMAGE_ORDER}, result.summary()
    # Same pixels count: verl's total-pad check would pass; the grids the trainer pairs with the runs do not.
    assert FailureKind.IMAGE_EXPANSION in kinds(result)


class _OneShort(ImageTokens):
    """A loop that expands every placeholder one token short of the processor (engine and trainer agree)."""

    def expand(self, image: Any) -> ExpandedImage:
        right = super().expand(image)
        return ExpandedImage(right.grid, right.length - 1)


def test_a_placeholder_expanded_to_the_wrong_count_is_caught(
    checker: ConsistencyChecker, vl_renderer: ChatRenderer, image_tokens: ImageTokens
) -> None:
    wrong = _OneShort(image_tokens.profile, image_tokens.processor)
    bad = drive(vl_renderer, wrong, [make_image(100, 100, 1)], [[make_image(56, 112, 2)], []])
    result = checker.check_rollout(bad.rollout())
    assert FailureKind.IMAGE_EXPANSION in kinds(result)
    assert "implies 16" in next(f.detail for f in result.engine_failures if f.kind is FailureKind.IMAGE_EXPANSION)


def test_an_images_tokens_trained_are_caught(checker: ConsistencyChecker, three_images: Any) -> None:
    sample = three_images.sample()
    span = three_images.trajectory.image_spans[1]  # a tool result's image: in the response
    p = len(sample.prompt_ids)
    mask = list(sample.response_mask)
    mask[span.position - p : span.position - p + span.length] = [1] * span.length
    trained = dataclasses.replace(sample, response_mask=tuple(mask))
    result = checker.check_rollout(three_images.rollout(sample=trained))
    assert FailureKind.IMAGE_TRAINED in kinds(result)


def test_a_placeholder_run_cut_from_the_stream_is_caught(checker: ConsistencyChecker, three_images: Any) -> None:
    sample = three_images.sample()
    span = three_images.trajectory.image_spans[2]
    p = len(sample.prompt_ids)
    response = list(sample.response_ids)
    cut = slice(span.position - p, span.position - p + span.length)
    del response[cut]
    mask, logprobs = list(sample.response_mask), list(sample.response_logprobs or ())
    del mask[cut], logprobs[cut]
    short = TrainerSample.of(sample.prompt_ids, response, mask, logprobs)
    assert len(placeholder_runs(short.stream, three_images.trajectory.image_tokens.profile.placeholder_id)) == 2
    result = checker.check_rollout(three_images.rollout(sample=short))
    assert FailureKind.IMAGE_DROPPED in kinds(result)


_SIDES = st.integers(min_value=20, max_value=200)
_IMAGES = st.lists(st.tuples(_SIDES, _SIDES), min_size=0, max_size=3)


@settings(max_examples=10, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=_IMAGES, tools=st.lists(_IMAGES, min_size=0, max_size=3))
def test_images_in_prompts_and_tool_results_give_no_defect(
    checker: ConsistencyChecker, vl_renderer: ChatRenderer, image_tokens: ImageTokens, prompt: list, tools: list
) -> None:
    seed = iter(range(1, 100))
    ro = drive(
        vl_renderer,
        image_tokens,
        [make_image(w, h, next(seed)) for w, h in prompt],
        [[make_image(w, h, next(seed)) for w, h in result] for result in tools],
    )
    result = checker.check_rollout(ro.rollout(), template_view=True)
    assert result.ok, result.summary()
    assert len(ro.trajectory.image_spans) == len(prompt) + sum(map(len, tools))
