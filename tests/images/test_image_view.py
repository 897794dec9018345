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
from verl_ext.check.image_view import image_replay, placeholder_runs
from verl_ext.check.inputs import EngineCall, EngineCalls, TrainerSample
from verl_ext.check.record import RolloutRecord, recorded_call_images, recorded_calls
from verl_ext.check.revalidate import engine_view_failures
from verl_ext.core.images import ExpandedImage, ImageTokens, image_digest
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.replay import RecordError


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
    assert result.image_calls_unchecked == ""  # every engine call's images were compared
    record = three_images.rollout().record(result)
    line = json.loads(json.dumps(record.to_json()))  # a record line: images as digests, spans in its extras
    assert [s["length"] for s in line["images"]["engine"]] == [16, 8, 77]
    assert RolloutRecord.from_json(line).extra["images"]["trainer"][2]["grid"] == [1, 14, 22]
    # per engine call, what it was given: the prompt's image, then the tool's two added, then the same three
    a, b, c = (s["digest"] for s in line["images"]["engine"])
    assert [call["images"] for call in line["engine_calls"]] == [
        {"kept": 0, "added": [a]},
        {"kept": 1, "added": [b, c]},
        {"kept": 3, "added": []},
    ]
    loaded = RolloutRecord.from_json(line)
    assert recorded_call_images(loaded.engine_calls) == [
        (c.prompt_length, d) for c, d in zip(loaded.engine_calls, [(a,), (a, b, c), (a, b, c)], strict=True)
    ]
    assert engine_view_failures(loaded, None) == ()  # the record alone re-checks clean


def _given(ro: Any, k: int, images: list[Any]) -> list[EngineCall]:
    """The rollout's engine calls, call ``k`` recorded as given ``images`` instead of its own."""
    calls = list(ro.calls)
    calls[k] = calls[k].replace(image_digests=[image_digest(im) for im in images])
    return calls


@pytest.mark.parametrize(
    ("defect", "given", "says"),
    [
        ("a swapped pair", lambda a, b, c, x: [a, c, b], "its image 1 is not its prompt's image 1"),
        ("a dropped image", lambda a, b, c, x: [a, c], "its image 1 is not its prompt's image 1"),
        ("the last image dropped", lambda a, b, c, x: [a, b], "its prompt's image 2 was not given"),
        ("an extra image", lambda a, b, c, x: [a, b, c, x], "its image 3 has no placeholder run in its prompt"),
        ("a changed image", lambda a, b, c, x: [a, x, c], "its image 1 is not its prompt's image 1"),
    ],
)
def test_an_engine_call_given_other_images_is_caught(
    checker: ConsistencyChecker, three_images: Any, defect: str, given: Any, says: str
) -> None:
    a, b, c = three_images.images
    images = given(a, b, c, make_image(64, 64, 9))
    calls = _given(three_images, 1, images)
    result = checker.check_rollout(three_images.rollout(calls=calls))
    # the trainer's images and spans are right: only the engine call's images are wrong, named as such
    assert kinds(result) == {FailureKind.IMAGE_ENGINE_MISMATCH}, (defect, result.summary())
    (failure,) = result.engine_failures
    assert failure.turn == 1 and says in failure.detail, failure.detail
    i = int(says.split("image ")[1].split()[0])
    engine = image_digest(images[i]) if i < len(images) else "none"
    prompt = three_images.trajectory.image_spans[i].digest if i < 3 else "none"
    assert f"engine call's digest {engine}, prompt's digest {prompt}" in failure.detail
    # the record holds the call's images: re-checking the record alone finds it too
    record = three_images.rollout(calls=calls).record(result)
    loaded = RolloutRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert {f.kind for f in engine_view_failures(loaded, None)} == {FailureKind.IMAGE_ENGINE_MISMATCH}


def test_the_first_call_given_an_image_its_prompt_does_not_hold_is_caught(
    checker: ConsistencyChecker, three_images: Any
) -> None:
    a, b, _ = three_images.images
    result = checker.check_rollout(three_images.rollout(calls=_given(three_images, 0, [a, b])))
    assert [(f.kind, f.turn) for f in result.engine_failures] == [(FailureKind.IMAGE_ENGINE_MISMATCH, 0)]


def test_calls_without_a_record_of_their_images_are_said_not_passed(
    checker: ConsistencyChecker, three_images: Any
) -> None:
    """A loop (or a record) from before the calls held their images: no failure invented, and the view says it
    had no per-call evidence instead of passing silently."""
    bare = [c.replace(image_digests=None) for c in three_images.calls]
    result = checker.check_rollout(three_images.rollout(calls=bare), template_view=True)
    assert result.ok, result.summary()
    assert result.image_calls_unchecked.startswith("no per-call evidence: 3 of 3 engine call(s)")
    assert "image view: no per-call evidence" in result.summary()
    # a version 3 record (no engine_calls[k].images, no image_calls_unchecked) loads and re-checks, said as such
    line = json.loads(json.dumps(three_images.rollout().record(result).to_json()))
    line["version"] = 3
    for call in line["engine_calls"]:
        del call["images"]
    del line["check"]["image_calls_unchecked"]
    old = RolloutRecord.from_json(line)
    assert all(c.images is None for c in old.engine_calls) and engine_view_failures(old, None) == ()
    note = image_replay(old.messages, old.extra, old.engine_calls)
    assert note is not None and "3 of 3 engine call(s) hold no record of the images" in note.note


def test_a_malformed_call_images_record_is_refused_naming_it(three_images: Any, checker: ConsistencyChecker) -> None:
    rollout = three_images.rollout()
    line = json.loads(json.dumps(rollout.record(checker.check_rollout(rollout)).to_json()))
    line["engine_calls"][1]["images"]["kept"] = 2  # the call before it was given one image
    with pytest.raises(RecordError, match=r"engine_calls\[1\]\.images\.kept' must be an integer from 0 to 1"):
        RolloutRecord.from_json(line, "f.jsonl:2")


def test_many_turns_hold_each_image_digest_once(vl_renderer: ChatRenderer, images: Any) -> None:
    """Each call repeats the images so far plus a new one: the log and the record hold O(images) digests (not
    O(turns x images)), and each image is digested once, however many calls were given it."""
    n = 60
    shots = [images(20 + k % 7, 20 + k % 5, k) for k in range(n)]
    digested: list[Any] = []
    calls = EngineCalls()
    import verl_ext.check.inputs as inputs

    real = inputs.image_digest
    inputs.image_digest = lambda im: digested.append(im) or real(im)  # type: ignore[assignment]
    try:
        for k in range(n):
            calls.record([1, 2, 3] + [7] * k, [7], [-0.1], "stop", images=shots[: k + 1])
    finally:
        inputs.image_digest = real  # type: ignore[assignment]
    assert len(digested) == n
    assert sum(len(c.images_added or ()) for c in calls) == n  # in memory: one digest per image
    assert calls[-1].image_digests == tuple(real(im) for im in shots)
    recorded = recorded_calls(calls)
    assert sum(len(c.images.added) for c in recorded if c.images) == n  # in the record: the same
    assert [len(d or ()) for _, d in recorded_call_images(recorded)] == list(range(1, n + 1))


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


@pytest.mark.parametrize("edge", ["first", "last"])
@pytest.mark.parametrize("image", [1, 2])
def test_one_trained_token_at_either_edge_of_an_image_span_is_caught(
    checker: ConsistencyChecker, three_images: Any, image: int, edge: str
) -> None:
    """Only the first or only the last placeholder token of a response image trained: the scan of the span's mask
    reads it (one that started a token late or ended a token early would pass it)."""
    sample = three_images.sample()
    span = three_images.trajectory.image_spans[image]
    p = len(sample.prompt_ids)
    at = span.position if edge == "first" else span.position + span.length - 1
    mask = list(sample.response_mask)
    mask[at - p] = 1
    result = checker.check_rollout(three_images.rollout(sample=dataclasses.replace(sample, response_mask=tuple(mask))))
    (failure,) = [f for f in result.engine_failures if f.kind is FailureKind.IMAGE_TRAINED]
    assert failure.position == at and f"image {image}: 1 of its {span.length} placeholder tokens" in failure.detail


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
    assert result.image_calls_unchecked == ""  # each engine call's images compared with its prompt's
    assert len(ro.trajectory.image_spans) == len(prompt) + sum(map(len, tools))


def test_a_call_departing_from_the_previous_calls_images_digests_from_there(images: Any) -> None:
    """A call whose images differ from the previous call's at some place (another object there) digests from that
    place on and keeps the digests before it; the same picture as another object is kept by digest."""
    a, b, c = images(30, 30, 1), images(40, 30, 2), images(30, 40, 3)
    digested: list[Any] = []
    import verl_ext.check.inputs as inputs

    real = inputs.image_digest
    inputs.image_digest = lambda im: digested.append(im) or real(im)  # type: ignore[assignment]
    try:
        calls = EngineCalls()
        calls.record([1, 2], [3], None, "stop", images=[a, b])
        calls.record([1, 2, 3, 4], [5], None, "stop", images=[a, c, b])
        calls.record([1, 2, 3, 4, 5, 6], [7], None, "stop", images=[a, c, b.copy()])  # b's pixels, another object
    finally:
        inputs.image_digest = real  # type: ignore[assignment]
    assert [id(x) for x in digested[2:4]] == [id(c), id(b)] and len(digested) == 5
    assert [(k.images_kept, k.images_added) for k in calls] == [
        (0, (real(a), real(b))),
        (1, (real(c), real(b))),
        (3, ()),
    ]
    assert calls[2].image_digests == (real(a), real(c), real(b))
