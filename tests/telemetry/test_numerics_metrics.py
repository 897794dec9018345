"""tito/numerics/* of a step: token-weighted per depth bucket and per turn over generated rollouts, the worst
rollout located, every bucket present, numerics_unavailable counted, mixed sources refused."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numerics_rollouts import make_rollout

from verl_ext.core.numerics import DEFAULT_DEPTH_EDGES, NumericsOptions, depth_bucket_label, summarize_rollout
from verl_ext.telemetry.numerics_metrics import PREFIX, TURN_METRICS, numerics_metrics

OPTIONS = NumericsOptions()


def step_of(seed: int, n: int) -> list:
    """``n`` generated rollouts on the default depth edges, as one step's numerics."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        r = dataclasses.replace(make_rollout(rng), options=OPTIONS)
        out.append((r, summarize_rollout(f"r{k}", source="old_log_prob", **r.kwargs())))
    return out


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(0, 6))
def test_bucket_figures_are_token_weighted_over_the_step(seed: int, n: int) -> None:
    step = step_of(seed, n)
    m = numerics_metrics([s for _, s in step], OPTIONS, unavailable=3)
    per_bucket: dict[str, list[float]] = {}
    per_turn: dict[str, list[float]] = {}
    for r, _ in step:
        for i in r.trained:
            d = r.trainer[i] - r.engine[i]
            per_bucket.setdefault(depth_bucket_label(DEFAULT_DEPTH_EDGES, r.bucket_of(i)), []).append(d)
            t = r.turn_of(i)
            per_turn.setdefault(str(t) if t < TURN_METRICS else f"{TURN_METRICS}+", []).append(d)
    assert m[f"{PREFIX}rollouts"] == n and m[f"{PREFIX}numerics_unavailable"] == 3
    assert m[f"{PREFIX}tokens"] == sum(len(r.trained) for r, _ in step)
    for b in range(len(DEFAULT_DEPTH_EDGES)):  # every bucket, measured or not
        label = depth_bucket_label(DEFAULT_DEPTH_EDGES, b)
        ds = per_bucket.get(label, [])
        assert m[f"{PREFIX}depth/{label}/tokens"] == len(ds)
        want = math.fsum(map(abs, ds)) / len(ds) if ds else 0.0
        assert math.isclose(m[f"{PREFIX}depth/{label}/mean_abs_delta"], want, rel_tol=1e-9, abs_tol=1e-15)
    turn_keys = {k.split("/")[3] for k in m if k.startswith(f"{PREFIX}turn/")}
    assert turn_keys == set(per_turn)
    for key, ds in per_turn.items():
        assert math.isclose(m[f"{PREFIX}turn/{key}/mean_delta"], math.fsum(ds) / len(ds), rel_tol=1e-9, abs_tol=1e-15)
    assert m[f"{PREFIX}drift_rollouts"] == 0 and m[f"{PREFIX}worst/position"] == -1


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.data())
def test_the_worst_rollout_is_the_drifting_one_and_its_start_is_named(seed: int, n: int, data) -> None:
    step = step_of(seed, n)
    trained = [(k, r) for k, (r, _) in enumerate(step) if r.trained]
    if not trained:
        return
    k, r = data.draw(st.sampled_from(trained))
    start = data.draw(st.sampled_from(r.trained))
    trainer = list(r.trainer)
    for i in r.trained:
        if i >= start:
            trainer[i] = r.engine[i] - 100.0 * len(r.mask)  # past any threshold in any bucket it enters
    drifting = dataclasses.replace(r, trainer=tuple(trainer))
    numerics = [s for _, s in step]
    numerics[k] = summarize_rollout(f"r{k}", source="old_log_prob", **drifting.kwargs())
    m = numerics_metrics(numerics, OPTIONS)
    assert m[f"{PREFIX}drift_rollouts"] == 1
    assert m[f"{PREFIX}worst/turn"] == r.turn_of(start)
    assert m[f"{PREFIX}worst/depth"] == DEFAULT_DEPTH_EDGES[r.bucket_of(start)]
    assert m[f"{PREFIX}worst/position"] == r.prompt_length + start


def test_an_empty_step_still_reports_every_figure() -> None:
    m = numerics_metrics([], OPTIONS, unavailable=8)
    assert m[f"{PREFIX}numerics_unavailable"] == 8 and m[f"{PREFIX}rollouts"] == 0
    assert all(f"{PREFIX}depth/{depth_bucket_label(DEFAULT_DEPTH_EDGES, b)}/mean_abs_delta" in m for b in range(9))
    assert all(v == 0 or v == -1 or k.endswith("numerics_unavailable") for k, v in m.items())


def test_turns_past_the_cap_are_one_group() -> None:
    n = TURN_METRICS + 4
    s = summarize_rollout("r", [-1.01] * n, [-1.0] * n, [1] * n, 0, list(range(n)), OPTIONS, "old_log_prob")
    m = numerics_metrics([s], OPTIONS)
    assert m[f"{PREFIX}turn/{TURN_METRICS}+/tokens"] == 4 and f"{PREFIX}turn/{TURN_METRICS}/tokens" not in m
    assert m[f"{PREFIX}turn/{TURN_METRICS - 1}/tokens"] == 1


def test_sources_and_edges_are_not_mixed() -> None:
    a = summarize_rollout("a", [-1.0], [-1.0], [1], 0, [0], OPTIONS, "old_log_prob")
    b = summarize_rollout("b", [-1.0], [-1.0], [1], 0, [0], OPTIONS, "refeed")
    with pytest.raises(ValueError, match="several sources"):
        numerics_metrics([a, b], OPTIONS)
    with pytest.raises(ValueError, match="bucketed by depth edges"):
        numerics_metrics([a], NumericsOptions(depth_edges=(0, 10)))
