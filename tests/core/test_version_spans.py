"""Version spans of engine calls: built from the segments engine_turn records, compact, and equal to the truth
token for token over generated rollouts; staleness and the stale-token ranges are the per-token sums."""

from __future__ import annotations

import random

import pytest
from version_rollouts import make_rollout

from verl_ext.core.version_spans import (
    Attempt,
    RolloutVersions,
    VersionSpan,
    as_version,
    lag_of,
    mixes_versions,
    older_than,
    spans,
    staleness,
)


def _per_token(call_spans: list[VersionSpan]) -> list[int | None]:
    out: list[int | None] = []
    for s in call_spans:
        assert s.start == len(out)  # the spans tile the output in order
        out += [s.version] * s.tokens
    return out


@pytest.mark.parametrize("seed", range(40))
def test_spans_are_the_versions_that_generated_each_token(seed: int) -> None:
    ro = make_rollout(random.Random(seed), abort_rate=0.5)
    versions = RolloutVersions.of(ro.segments, trained_step=None)
    for k, segs in enumerate(ro.segments):
        call_spans = spans(segs)
        assert _per_token(call_spans) == ro.truth[k]
        assert all(a.version != b.version for a, b in zip(call_spans, call_spans[1:], strict=False))  # merged
        assert versions.spans()[k] == call_spans
        assert mixes_versions(call_spans) == (len(set(ro.truth[k])) > 1)
    # served: the version the turn's last attempt was sent on
    assert versions.served == [t[-1] for t in ro.truth]


@pytest.mark.parametrize("seed", range(20))
def test_staleness_is_the_token_weighted_lag_and_stale_ranges_are_the_tokens_past_the_threshold(seed: int) -> None:
    ro = make_rollout(random.Random(seed))
    trained = max(v for t in ro.truth for v in t) + 1 + seed % 3
    versions = RolloutVersions.of(ro.segments, trained_step=trained)
    lags = [lag_of(v, trained) for t in ro.truth for v in t]
    total = versions.staleness()
    assert total.tokens == len(lags) and total.lag_sum == sum(lags) and total.max_lag == max(lags)
    assert total.mean == pytest.approx(sum(lags) / len(lags))
    for k, t in enumerate(ro.truth):
        masked = {i for a, b in older_than(spans(ro.segments[k]), trained, 1) for i in range(a, b)}
        assert masked == {i for i, v in enumerate(t) if lag_of(v, trained) > 1}


def test_the_step_a_version_serves_is_the_next_one() -> None:
    # verl syncs the weights after step k with global_steps=k: version 4 serves step 5, on-policy
    assert lag_of(4, 5) == 0 and lag_of(3, 5) == 1
    assert staleness([VersionSpan(4, 0, 10), VersionSpan(None, 10, 12)], 5).unknown == 2


def test_versions_are_read_as_integers_and_anything_else_is_unknown() -> None:
    assert [as_version(v) for v in (3, "3", " 12 ", "default", None, True, 2.0)] == [3, 3, 12, None, None, None, None]


def test_a_recorded_row_round_trips_and_a_malformed_one_names_its_shape() -> None:
    row = Attempt(3, 0, 5, 3, 1, 7, 8, 9)
    assert Attempt.from_list(row.to_list()) == row
    assert Attempt.from_list([3, 0, 5]) == Attempt(3, 0, 5)
    for bad in ([3, 0], [3, "0", 5], [1.5, 0, 5], [True, 0, 5]):
        with pytest.raises(ValueError, match=r"\[version, start, end"):
            Attempt.from_list(bad)
    versions = RolloutVersions(((row,),), 4)
    assert RolloutVersions.from_json(versions.to_json()) == versions
    with pytest.raises(ValueError, match="trained_step"):
        RolloutVersions.from_json({"trained_step": "4", "calls": []})
