"""tito/async/ counters of generated rollouts are the per-token truth, summed; the step's ratios are ratios of the
summed counters; what the engine did not stamp is counted, never read as on-policy."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from version_rollouts import make_rollout, turn_segments

from verl_ext.core.version_spans import DISPATCH_VERSION_FIELD, PROMPT_CRC_FIELD, RolloutVersions, lag_of
from verl_ext.telemetry.async_metrics import async_ratios, version_counters


def test_the_steps_counters_and_ratios_are_the_per_token_truth() -> None:
    rng = random.Random(7)
    rollouts = [make_rollout(rng, abort_rate=0.5) for _ in range(8)]
    trained = 1 + max(v for ro in rollouts for t in ro.truth for v in t)
    total: Counter[str] = Counter()
    for ro in rollouts:
        total.update(version_counters(RolloutVersions.of(ro.segments, trained)))
    metrics = {f"tito/{k}": float(v) for k, v in total.items()}
    async_ratios(metrics, "tito/")
    lags = [lag_of(v, trained) for ro in rollouts for t in ro.truth for v in t]
    turns = sum(len(ro.truth) for ro in rollouts)
    assert metrics["tito/async/staleness_mean"] == pytest.approx(sum(lags) / len(lags))
    assert metrics["tito/async/tokens_lag_0"] == lags.count(0)
    assert metrics["tito/async/mixed_turn_share"] == pytest.approx(
        sum(len(set(t)) > 1 for ro in rollouts for t in ro.truth) / turns
    )
    assert metrics["tito/async/resumes_per_turn"] == pytest.approx(
        sum(len(a) - 1 for ro in rollouts for a in ro.attempts) / turns
    )
    assert metrics["tito/async/unstamped_tokens"] == 0 and metrics["tito/async/unverified_resumes"] == 0


def test_unstamped_tokens_and_unverified_resumes_are_counted() -> None:
    ro = make_rollout(random.Random(2), abort_rate=0.6)
    for attempts in ro.attempts:
        for a in attempts:
            del a.report[DISPATCH_VERSION_FIELD], a.report[PROMPT_CRC_FIELD]

    segments = [turn_segments(a)[2] for a in ro.attempts]
    c = version_counters(RolloutVersions.of(segments, 9))
    assert c["async/unstamped_tokens"] == sum(len(t) for t in ro.truth) and c["async/versioned_tokens"] == 0
    assert c["async/unverified_resumes"] == sum(len(a) - 1 for a in ro.attempts)
    metrics = {f"tito/{k}": float(v) for k, v in c.items()}
    async_ratios(metrics, "tito/")
    assert metrics["tito/async/staleness_mean"] == 0.0  # no token with a version: nothing averaged, not "on-policy"
