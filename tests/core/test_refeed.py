"""The re-feed audit's pure rules (core/refeed.py): a scoring path that lies, in any of the ways a path lies, is
refused by the canary; an honest one within the engine's gap is accepted; audited rollouts are a fixed fraction;
a re-score is compared only on the weights that sampled it."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_ext.core.numerics import NumericsOptions, summarize_rollout
from verl_ext.core.refeed import (
    CPU_SCORING_TOLERANCE,
    CanaryVerdict,
    audited,
    calibrate_tolerance,
    canary_verdict,
    refeed_numerics,
)

TOL = 1e-4


@st.composite
def canaries(draw: st.DrawFn) -> tuple[list[int], list[float]]:
    n = draw(st.integers(1, 64))
    ids = draw(st.lists(st.integers(0, 151_000), min_size=n, max_size=n))
    logprobs = draw(st.lists(st.floats(-25, 0), min_size=n, max_size=n))
    return ids, logprobs


@settings(max_examples=300, deadline=None)
@given(canary=canaries(), seed=st.integers(0, 2**32))
def test_an_honest_path_within_the_gap_is_accepted(canary: tuple[list[int], list[float]], seed: int) -> None:
    ids, logprobs = canary
    rng = random.Random(seed)
    scores = [x + rng.uniform(-TOL, TOL) * 0.9 for x in logprobs]
    verdict = canary_verdict("cpu", ids, logprobs, ids, scores, TOL)
    assert verdict.accepted and verdict.reason == "" and verdict.tokens == len(ids)
    assert verdict.max_abs_delta <= TOL


LIES = ("shift", "shift_past", "one_token", "off_by_one", "wrong_id", "short", "nan", "temperature")


@settings(max_examples=400, deadline=None)
@given(canary=canaries(), lie=st.sampled_from(LIES), seed=st.integers(0, 2**32))
def test_every_kind_of_lying_path_is_refused_with_the_reason(
    canary: tuple[list[int], list[float]], lie: str, seed: int
) -> None:
    ids, logprobs = canary
    rng = random.Random(seed)
    n = len(ids)
    scored_ids, scores = list(ids), list(logprobs)
    at = rng.randrange(n)
    if lie == "shift":  # sparkinfer #1001: every score some nats off
        size = rng.choice((-1, 1)) * rng.uniform(2 * TOL, 30)
        scores = [x + size for x in scores]
    elif lie == "shift_past":  # right for the first tokens, wrong after
        scores = scores[:at] + [x - rng.uniform(2 * TOL, 5) for x in scores[at:]]
    elif lie == "one_token":
        scores[at] += rng.choice((-1, 1)) * rng.uniform(2 * TOL, 1)
    elif lie == "off_by_one":  # each score belongs to the next position
        scores = [*scores[1:], rng.uniform(-25, 0)]
        if all(abs(a - b) <= TOL for a, b in zip(scores, logprobs, strict=True)):
            return  # a constant run of logprobs: shifting it changes nothing, and nothing is wrong
    elif lie == "wrong_id":
        scored_ids[at] += 1
    elif lie == "short":
        scored_ids, scores = scored_ids[:-1], scores[:-1]
    elif lie == "nan":
        scores[at] = math.nan
    elif lie == "temperature":  # scored at another temperature: logprobs scaled
        scores = [x * 1.3 - 0.01 for x in scores]
    verdict = canary_verdict("cpu", ids, logprobs, scored_ids, scores, TOL)
    assert not verdict.accepted, (lie, verdict)
    assert verdict.reason.startswith("re-feed audit: the scoring path of cpu is refused: ")
    assert "its scores are not used" in verdict.reason
    if lie in ("shift", "one_token", "nan"):
        assert verdict.position == at if lie != "shift" else verdict.position is not None


def test_the_refusal_names_the_gap_and_where() -> None:
    verdict = canary_verdict("sglang", [1, 2, 3], [-1.0, -2.0, -3.0], [1, 2, 3], [-1.0, -2.0, -23.0], TOL)
    assert not verdict.accepted and verdict.position == 2 and verdict.max_abs_delta == pytest.approx(20.0)
    assert "differ from generation by up to 20 nats (canary position 2), over its tolerance 0.0001" in verdict.reason
    assert verdict.to_json()["accepted"] is False
    with pytest.raises(ValueError, match="tolerance"):
        canary_verdict("cpu", [1], [-1.0], [1], [-1.0], 0.0)
    with pytest.raises(ValueError, match="at least one id"):
        canary_verdict("cpu", [], [], [], [], TOL)


def test_calibration() -> None:
    assert calibrate_tolerance([2e-7, 5e-7]) == pytest.approx(5e-6)
    assert calibrate_tolerance([0.0]) == 1e-6
    assert calibrate_tolerance([0.01], margin=4) == pytest.approx(0.04)
    for bad in ([], [math.nan], [-1.0]):
        with pytest.raises(ValueError, match="gaps"):
            calibrate_tolerance(bad)
    assert CPU_SCORING_TOLERANCE < 0.05  # far below the numerics view's default drift threshold


def test_audited_rollouts_are_a_fixed_fraction_of_ids() -> None:
    ids = [f"rollout-{i}" for i in range(20_000)]
    for fraction in (0.05, 0.3, 0.9):
        share = sum(audited(i, fraction) for i in ids) / len(ids)
        assert abs(share - fraction) < 0.02, (fraction, share)
    assert not any(audited(i, 0.0) for i in ids[:500]) and all(audited(i, 1.0) for i in ids[:500])
    assert [audited(i, 0.3) for i in ids[:200]] == [audited(i, 0.3) for i in ids[:200]]
    small = {i for i in ids if audited(i, 0.1)}
    assert small <= {i for i in ids if audited(i, 0.3)}  # a larger fraction audits a superset
    with pytest.raises(ValueError, match="fraction"):
        audited("x", 1.5)


ACCEPTED = CanaryVerdict("cpu", True, 32, 1e-7, 3, TOL)


def test_a_rescore_is_summarized_as_refeed_numerics() -> None:
    options = NumericsOptions()
    sampled = [-1.0, 0.0, -2.0, -0.5, -3.0]
    scored = [-1.1, 0.0, -2.0, -0.2, -3.0]
    mask = [1, 0, 1, 1, 1]
    result = refeed_numerics(
        "r1", scored, sampled, mask, 10, [0, 2], options, sampled_version=3, scored_version=3, canary=ACCEPTED, step=4
    )
    assert result.reason == "" and result.numerics is not None
    expected = summarize_rollout("r1", scored, sampled, mask, 10, [0, 2], options, "refeed", 4)
    assert result.numerics == expected and result.numerics.source == "refeed"
    assert result.numerics.overall.count == 4 and result.numerics.overall.max_abs == pytest.approx(0.3)
    assert result.to_json()["sampled_version"] == 3


def test_a_rescore_is_not_compared_across_a_weight_update_or_through_a_refused_path() -> None:
    options = NumericsOptions()
    args = ("r1", [-1.0], [-1.0], [1], 5, [0], options)
    moved = refeed_numerics(*args, sampled_version=3, scored_version=4, canary=ACCEPTED)
    assert moved.numerics is None and "a weight update came between" in moved.reason
    lying = canary_verdict("cpu", [1], [-1.0], [1], [-21.0], TOL)
    refused = refeed_numerics(*args, sampled_version=3, scored_version=3, canary=lying)
    assert refused.numerics is None and refused.reason == lying.reason
