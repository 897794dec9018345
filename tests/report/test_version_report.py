"""The report's version views: a rollout's strip holds each version's tokens where they were generated and a tick at
each abort; the run's staleness over steps is the token-weighted lag of the records; the page draws both where the
records have versions (the page itself: tests/telemetry/test_record_versions.py)."""

from __future__ import annotations

import random

import pytest
from version_rollouts import make_rollout

from verl_ext.core.version_spans import RolloutVersions, lag_of
from verl_ext.report.versions import staleness_by_step, version_strip


class _Record:
    """What the version views read of a record: its ``versions`` and ``step``."""

    def __init__(self, versions: RolloutVersions | None, step: int) -> None:
        self.versions, self.step = versions, step


@pytest.mark.parametrize("seed", range(20))
def test_a_strip_is_the_truth_token_for_token_with_a_tick_per_abort(seed: int) -> None:
    ro = make_rollout(random.Random(seed), abort_rate=0.5)
    strip = version_strip(_Record(RolloutVersions.of(ro.segments, 9), 9))
    drawn = [p.version for p in strip.pieces for _ in range(p.end - p.start)]
    assert drawn == [v for t in ro.truth for v in t] and strip.tokens == len(drawn)
    ends, at = [], 0
    for attempts in ro.attempts:
        for a in attempts[:-1]:
            at += len(a.ids)
            ends.append(at)
        at += len(attempts[-1].ids)
    assert list(strip.aborts) == ends


def test_staleness_over_steps_is_the_token_weighted_lag_per_trained_step() -> None:
    rng = random.Random(3)
    rollouts = [make_rollout(rng) for _ in range(6)]
    records = [_Record(RolloutVersions.of(ro.segments, 10 + k % 2), 0) for k, ro in enumerate(rollouts)]
    series = staleness_by_step([*records, _Record(None, 10)])
    assert series.steps == [10, 11] and series.unversioned == 1
    for step in (10, 11):
        lags = [lag_of(v, step) for k, ro in enumerate(rollouts) if 10 + k % 2 == step for t in ro.truth for v in t]
        assert series.mean_lag(step) == pytest.approx(sum(lags) / len(lags)) and series.max_lag(step) == max(lags)
