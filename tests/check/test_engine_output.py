"""Invalid engine output (ids the tokenizer cannot decode, NaN/inf/positive logprobs, SGLang's NaN stop, logprob
counts): never a crash, never a trained token, always a named engine-view failure and a tito/ counter."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rollouts import IM_END, Turn, qwen3_answer_turn, run

from verl_ext.check import ConsistencyChecker, EngineCall, FailureKind, TrainerSample
from verl_ext.core.engine_output import NAN_HAPPENED, OutputProblemKind, validate_engine_output
from verl_ext.core.invariants import check_invariants
from verl_ext.core.trajectory import TokenKind
from verl_ext.telemetry.metrics import aggregate

ANSWER = {"role": "assistant", "content": "The answer is 2."}
NAN, INF = float("nan"), float("inf")
VOCAB = 151669  # Qwen3's tokenizer, added tokens included


def kinds(problems) -> list[str]:
    return [p.kind.value for p in problems]


def test_a_clean_output_has_no_problem():
    assert validate_engine_output([1, 2, IM_END], [-0.1, -2.0, -1e-7], VOCAB, stop_ids={IM_END}) == ()
    assert validate_engine_output([], [], VOCAB) == ()
    assert validate_engine_output([1, 2], None, VOCAB) == ()
    assert validate_engine_output([1, 2], [0.0005, -1.0], VOCAB) == ()  # rounding above 0 is tolerated


def test_finite_logprobs_whose_sum_overflows_are_no_problem():
    # The valid case is recognised from the sum; a sum of finite values can still overflow to -inf, and that output
    # must go to the per-value checks and come out clean, not be called non-finite.
    assert math.isinf(sum([-1e308, -1e308]))
    assert validate_engine_output([1, 2], [-1e308, -1e308], VOCAB) == ()
    assert kinds(validate_engine_output([1, 2, 3], [-1e308, -1e308, NAN], VOCAB)) == ["logprob_not_finite"]


def test_engine_call_and_trainer_sample_convert_to_plain_ints_and_floats():
    call = EngineCall.of(np.array([3, 4]), [5, True], np.array([-0.5, -0.25], dtype=np.float32), "stop")
    assert call.prompt_ids == (3, 4) and call.output_ids == (5, 1) and call.logprobs == (-0.5, -0.25)
    assert {type(i) for i in (*call.prompt_ids, *call.output_ids)} == {int}  # a bool becomes its int
    assert {type(x) for x in call.logprobs} == {float}
    ids = (7, 8)
    assert EngineCall.of(ids, ids).output_ids is ids  # a tuple of ints is kept as is (a prompt is packed)
    sample = TrainerSample.of([1, 2], (np.int64(3),), [np.int8(1)], [-1])
    assert sample.response_ids == (3,) and type(sample.response_ids[0]) is int
    assert sample.response_mask == (1,) and type(sample.response_mask[0]) is int
    assert sample.response_logprobs == (-1.0,) and type(sample.response_logprobs[0]) is float


@pytest.mark.parametrize(
    ("ids", "logprobs", "finish", "expected", "index"),
    [
        ([5, 99999999], [-0.1, -0.2], None, ["id_out_of_vocab"], 1),
        ([5, VOCAB], None, None, ["id_out_of_vocab"], 1),  # the first id past the tokenizer
        ([-1, 5], [-0.1, -0.2], None, ["negative_id"], 0),
        ([5, 6, 7], [-0.1, NAN, -0.3], None, ["logprob_not_finite"], 1),
        ([5, 6], [-INF, -0.3], None, ["logprob_not_finite"], 0),
        ([5, 6], [-0.1, 0.7], None, ["logprob_positive"], 1),
        ([5, 6], [-0.1], None, ["logprob_count"], 0),
        ([5, IM_END], [-0.1, NAN], None, ["nan_stop"], 1),  # the substituted stop: a NaN logprob on a stop id
        ([5, IM_END], [-0.1, -0.2], NAN_HAPPENED, ["nan_stop"], 1),  # SGLang's finish reason says so
        ([5, IM_END], None, {"type": "stop", "matched": NAN_HAPPENED}, ["nan_stop"], 1),
    ],
)
def test_each_problem_is_named_at_its_position(ids, logprobs, finish, expected, index):
    problems = validate_engine_output(ids, logprobs, VOCAB, stop_ids={IM_END}, finish_reason=finish)
    assert kinds(problems) == expected
    assert problems[0].index == index and problems[0].detail


@pytest.mark.parametrize(
    ("tail", "tail_logprobs", "finish", "failure", "kept"),
    [
        ([99999999, IM_END], [-0.5, -0.1], "stop", FailureKind.ID_OUT_OF_VOCAB, 0),
        ([-3, IM_END], [-0.5, -0.1], "stop", FailureKind.NEGATIVE_ID, 0),
        ([9454, IM_END], [NAN, -0.1], "stop", FailureKind.LOGPROB_NOT_FINITE, 0),
        ([9454, IM_END], [2.5, -0.1], "stop", FailureKind.LOGPROB_POSITIVE, 0),
        ([9454, IM_END], [-0.5, NAN], "stop", FailureKind.NAN_STOP, 1),
        ([9454, IM_END], [-0.5, -0.1], NAN_HAPPENED, FailureKind.NAN_STOP, 1),
    ],
)
def test_trajectory_keeps_the_valid_prefix_and_the_check_names_the_failure(
    renderer_for, tail, tail_logprobs, finish, failure, kept
):
    r = renderer_for("qwen3")
    head = r.encode("<think>\n\n</think>\n\nThe answer")
    ids, logprobs = [*head, *tail], [-0.25] * len(head) + tail_logprobs
    ro = run(r, [Turn(ids, ANSWER, finish=finish, logprobs=logprobs)])  # no exception: the step goes on
    t = ro.trajectory

    assert [p.kind.value for _, p in t.output_problems] == [failure.value]
    sampled = [i for i, k in zip(t.input_ids, t.kinds, strict=True) if k is TokenKind.SAMPLED]
    assert sampled == head + tail[:kept]  # up to the first problem, as sampled; nothing after it is trained
    assert all(0 <= i < r.vocab_size for i in t.input_ids)
    assert all(math.isfinite(x) and x <= 0 for x in t.logprobs)
    assert t.input_ids[-1] == IM_END and t.kinds[-1] is TokenKind.REPAIR  # the cut turn gets a synthetic close
    assert check_invariants(t).ok

    result = ConsistencyChecker(r).check(ro.calls, ro.sample(), ro.messages)
    assert [f.kind for f in result.engine_failures] == [failure]  # named, and nothing else (no stream/mask noise)
    assert result.engine_failures[0].position == ro.calls[0].output_start + len(head) + kept
    metrics = aggregate([result])
    assert metrics[f"tito/engine_view/{failure.value}"] == 1 and metrics["tito/engine_view_failures"] == 1
    assert all(metrics[f"tito/engine_view/{k.value}"] == 0 for k in FailureKind if k is not failure)


def test_a_loop_that_trains_invalid_output_is_caught_too(renderer_for):
    """A stock loop keeps the engine's ids and logprobs as they are: the check names the problem all the same."""
    r = renderer_for("qwen3")
    ids = [*qwen3_answer_turn(r)[:-1], 99999999, IM_END]
    ro = run(r, [Turn(qwen3_answer_turn(r), ANSWER)])
    call = ro.calls[0]
    p = len(call.prompt_ids)
    kept = TrainerSample.of(call.prompt_ids, ids, [1] * len(ids), [-0.5] * len(ids))
    bad_call = type(call).of(call.prompt_ids, ids, [-0.5] * len(ids))
    result = ConsistencyChecker(r).check([bad_call], kept, ro.messages)
    assert [f.kind for f in result.engine_failures] == [FailureKind.ID_OUT_OF_VOCAB]
    assert result.engine_failures[0].position == p + len(ids) - 2


def test_a_later_turn_after_a_rejected_one_is_not_trained_against_the_engine(renderer_for):
    """The rejected turn's cut must not hide a trainer that changed tokens before it."""
    r = renderer_for("qwen3")
    head = r.encode("<think>\n\n</think>\n\nThe answer")
    ro = run(r, [Turn([*head, 99999999], ANSWER)])
    sample = ro.sample()
    resp = list(sample.response_ids)
    resp[0] = 11  # the trainer's first sampled token is not the engine's
    changed = TrainerSample.of(sample.prompt_ids, resp, sample.response_mask, sample.response_logprobs)
    result = ConsistencyChecker(r).check(ro.calls, changed, ro.messages)
    assert {f.kind for f in result.engine_failures} == {FailureKind.ID_OUT_OF_VOCAB, FailureKind.STREAM}


def test_problem_kinds_and_failure_kinds_agree():
    assert {k.value for k in OutputProblemKind} <= {k.value for k in FailureKind}
