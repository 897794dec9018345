"""The numerics core (verl_ext.core.numerics): summaries per turn and depth against a per-token oracle over
generated rollouts, mergeability, mask-0 tokens never counted, the verdict localizing injected drift, options'
refusals, and mutants of the module caught by the same properties."""

from __future__ import annotations

import json
import math
import random
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numerics_rollouts import NumericsRollout, make_rollout, oracle

import verl_ext.core.numerics as numerics
from verl_ext.core.numerics import (
    DEFAULT_DEPTH_EDGES,
    DeltaStats,
    NumericsOptions,
    RolloutNumerics,
    depth_bucket_label,
    summarize_rollout,
)

SEEDS = st.integers(min_value=0, max_value=2**32 - 1)
PROPERTY = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def summarize(r: NumericsRollout, module: types.ModuleType = numerics, **over: Any) -> RolloutNumerics:
    kwargs = r.kwargs() | over
    return module.summarize_rollout("r0", source="old_log_prob", **kwargs)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def assert_matches_oracle(r: NumericsRollout, got: RolloutNumerics) -> None:
    want = oracle(r)
    got_maps = {
        "overall": {0: got.overall} if got.overall.count else {},
        "by_turn": got.by_turn,
        "by_depth": got.by_depth,
    }
    for name, by in want.items():
        assert set(got_maps[name]) == set(by), (name, sorted(got_maps[name]), sorted(by))
        for key, w in by.items():
            s = got_maps[name][key]
            assert s.count == w["count"], (name, key)
            assert s.nonfinite == 0
            assert s.first_past == w["first_past"], (name, key)
            for k in ("sum_abs", "max_abs", "sum_delta", "sum_k3"):
                assert close(getattr(s, k), w[k]), (name, key, k, getattr(s, k), w[k])


def assert_stats_close(a: DeltaStats, b: DeltaStats) -> None:
    assert (a.count, a.nonfinite, a.first_past) == (b.count, b.nonfinite, b.first_past)
    for k in ("sum_abs", "max_abs", "sum_delta", "sum_k3"):
        assert close(getattr(a, k), getattr(b, k)), k


def restrict(r: NumericsRollout, keep: range) -> NumericsRollout:
    """The same rollout with mask 1 only inside ``keep`` (a part of it, as another micro-batch or rank sees)."""
    return NumericsRollout(
        r.prompt_length,
        r.turn_starts,
        tuple(m if i in keep else 0 for i, m in enumerate(r.mask)),
        r.engine,
        r.trainer,
        r.options,
    )


def drift_from(r: NumericsRollout, positions: list[int], magnitude: float) -> NumericsRollout:
    trainer = list(r.trainer)
    for i in positions:
        trainer[i] = r.engine[i] - magnitude
    return r.with_trainer(trainer)


# Drift no bucket can dilute below the threshold (one drifting token lifts any bucket of these rollouts past it),
# and past the per-token threshold.
def big_drift(r: NumericsRollout) -> float:
    return max(2 * r.options.drift_mean_abs_delta * (len(r.mask) + 1), 2 * r.options.token_abs_delta)


@PROPERTY
@given(SEEDS)
def test_summaries_match_the_per_token_oracle(seed: int) -> None:
    r = make_rollout(random.Random(seed))
    assert_matches_oracle(r, summarize(r))


@PROPERTY
@given(SEEDS, st.data())
def test_merge_of_split_summaries_is_the_summary_of_the_whole(seed: int, data: st.DataObject) -> None:
    r = make_rollout(random.Random(seed))
    n = len(r.mask)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=4)))
    parts = [range(a, b) for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
    merged = summarize(restrict(r, parts[0]))
    for part in parts[1:]:
        merged = merged.merge(summarize(restrict(r, part)))
    whole = summarize(r)
    assert_stats_close(merged.overall, whole.overall)
    for name in ("by_turn", "by_depth"):
        assert set(getattr(merged, name)) == set(getattr(whole, name))
        for k, s in getattr(whole, name).items():
            assert_stats_close(getattr(merged, name)[k], s)


@PROPERTY
@given(SEEDS, SEEDS)
def test_mask_0_tokens_are_never_counted(seed: int, garbage_seed: int) -> None:
    """Whatever logprobs sit under mask 0 (NaN, inf, 1e6: padding, tool output), the summary is the same."""
    r = make_rollout(random.Random(seed))
    g = random.Random(garbage_seed)
    other = NumericsRollout(
        r.prompt_length,
        r.turn_starts,
        r.mask,
        tuple(e if m else g.choice([math.nan, -math.inf, 1e9, -3.0]) for e, m in zip(r.engine, r.mask, strict=True)),
        tuple(t if m else g.choice([math.nan, math.inf, -1e9, 2.0]) for t, m in zip(r.trainer, r.mask, strict=True)),
        r.options,
    )
    assert summarize(other).to_json() == summarize(r).to_json()


@PROPERTY
@given(SEEDS)
def test_a_clean_rollout_is_ok(seed: int) -> None:
    r = make_rollout(random.Random(seed))
    v = summarize(r).verdict(r.options)
    assert v.status == "ok", v
    assert (v.turn, v.depth_bucket, v.position) == (None, None, None)


@PROPERTY
@given(SEEDS, st.data())
def test_drift_from_a_turn_on_is_localized_to_that_turn(seed: int, data: st.DataObject) -> None:
    r = make_rollout(random.Random(seed))
    turns = sorted({r.turn_of(i) for i in r.trained})
    if not turns:
        return
    k = data.draw(st.sampled_from(turns))
    only_one = data.draw(st.booleans())
    hit = [i for i in r.trained if (r.turn_of(i) == k if only_one else r.turn_of(i) >= k)]
    v = summarize(drift := drift_from(r, hit, big_drift(r))).verdict(r.options)
    assert v.status == "drift"
    assert v.turn == k
    assert v.position == r.prompt_length + hit[0]
    assert v.depth_bucket == drift.bucket_of(hit[0])


@PROPERTY
@given(SEEDS, st.data())
def test_drift_past_a_depth_is_localized_to_its_bucket(seed: int, data: st.DataObject) -> None:
    r = make_rollout(random.Random(seed))
    if not r.trained:
        return
    start = data.draw(st.sampled_from(r.trained))
    hit = [i for i in r.trained if i >= start]
    v = summarize(drift_from(r, hit, big_drift(r))).verdict(r.options)
    assert (v.status, v.position, v.depth_bucket, v.turn) == (
        "drift",
        r.prompt_length + start,
        r.bucket_of(start),
        r.turn_of(start),
    )


@PROPERTY
@given(SEEDS)
def test_json_round_trip(seed: int) -> None:
    s = summarize(make_rollout(random.Random(seed)))
    text = json.dumps(s.to_json(), allow_nan=False)
    assert RolloutNumerics.from_json(json.loads(text)) == s


def test_k3_is_verls_k3_kl() -> None:
    """verl 0.9.1 rollout_corr/k3_kl: masked mean of exp(log_ratio) - log_ratio - 1, log_ratio = old - rollout."""
    s = DeltaStats()
    for i, d in enumerate([0.3, -0.2, 0.05]):
        s.add(d, i, 1.0)
    want = sum(math.exp(d) - d - 1 for d in [0.3, -0.2, 0.05]) / 3
    assert math.isclose(s.k3, want, rel_tol=1e-12)
    assert math.isclose(s.mean_delta, 0.05, rel_tol=1e-12)
    assert math.isclose(s.mean_abs, 0.55 / 3, rel_tol=1e-12)


def test_the_sign_of_delta_is_trainer_minus_engine() -> None:
    s = summarize_rollout("r", [-1.0, -1.0], [-1.5, -1.25], [1, 1], 0, [0], NumericsOptions(), "refeed")
    assert s.overall.mean_delta == pytest.approx(0.375)


def test_depth_counts_the_prompt() -> None:
    opts = NumericsOptions(depth_edges=(0, 10))
    s = summarize_rollout("r", [-1.0] * 4, [-1.0] * 4, [1, 1, 1, 1], 8, [0], opts, "old_log_prob")
    assert {b: st.count for b, st in s.by_depth.items()} == {0: 2, 1: 2}
    assert depth_bucket_label(opts.depth_edges, 1) == "10+"
    assert depth_bucket_label(DEFAULT_DEPTH_EDGES, 0) == "0-512"


def test_non_finite_delta_on_a_trained_token_is_drift_not_a_crash() -> None:
    opts = NumericsOptions()
    s = summarize_rollout("r", [-1.0, math.nan, -1.0], [-1.0, -1.0, -1.0], [1, 1, 1], 5, [0, 1], opts, "old_log_prob")
    assert (s.overall.count, s.overall.nonfinite, s.overall.first_past) == (2, 1, 6)
    v = s.verdict(opts)
    assert (v.status, v.turn, v.position) == ("drift", 1, 6)
    assert "non-finite" in v.reason
    assert json.loads(json.dumps(s.to_json(), allow_nan=False))  # the sums stay finite: strict JSON holds them


def test_spread_drift_has_no_position() -> None:
    """Every token 0.1 off: each bucket's mean passes 0.05, no token passes 0.5."""
    opts = NumericsOptions()
    s = summarize_rollout("r", [-1.1] * 20, [-1.0] * 20, [1] * 20, 0, [0], opts, "old_log_prob")
    v = s.verdict(opts)
    assert (v.status, v.turn, v.depth_bucket, v.position) == ("drift", 0, 0, None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"trainer_logprobs": [-1.0]}, "one entry per response position"),
        ({"response_mask": [1, 2]}, "must be 0 or 1, got 2"),
        ({"turn_starts": [1]}, "no turn starts at or before it"),
        ({"turn_starts": [0, 2, 1]}, "non-decreasing"),
        ({"turn_starts": [0, True]}, "turn_starts a list of integers"),
        ({"prompt_length": -1}, "prompt_length must be an integer >= 0"),
        ({"prompt_length": 1.5}, "prompt_length must be an integer >= 0"),
        ({"source": "trainer"}, "source must be one of"),
    ],
)
def test_bad_input_is_refused_with_the_problem(args: dict[str, Any], message: str) -> None:
    kwargs: dict[str, Any] = {
        "rollout_id": "r",
        "trainer_logprobs": [-1.0, -1.0],
        "engine_logprobs": [-1.0, -1.0],
        "response_mask": [1, 1],
        "prompt_length": 3,
        "turn_starts": [0],
        "options": NumericsOptions(),
        "source": "old_log_prob",
    }
    with pytest.raises(ValueError, match=message):
        summarize_rollout(**(kwargs | args))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (NumericsOptions(depth_edges=()), "non-empty list of integer"),
        (NumericsOptions(depth_edges=(512, 1024)), r"must start at 0.*\[0, 512, 1024\]"),
        (NumericsOptions(depth_edges=(0, 8, 8)), r"strictly increasing.*\[0, 8\]"),
        (NumericsOptions(depth_edges=(0, 1.5)), "integer token positions"),  # type: ignore[arg-type]
        (NumericsOptions(drift_mean_abs_delta=0.0), r"drift_mean_abs_delta must be a positive.*default is 0.05"),
        (NumericsOptions(token_abs_delta=math.nan), "token_abs_delta must be a positive finite"),
        (NumericsOptions(token_abs_delta="0.5"), "token_abs_delta must be a positive finite"),  # type: ignore[arg-type]
    ],
)
def test_options_problems_name_the_fix(options: NumericsOptions, message: str) -> None:
    problems = options.problems()
    assert len(problems) == 1
    assert re.search(message, problems[0]), problems[0]
    assert problems[0].startswith("verl_ext.numerics.")


def test_default_options_have_no_problems() -> None:
    assert NumericsOptions().problems() == []


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d | {"source": "x"}, "source must be one of"),
        (lambda d: d | {"by_depth": {"99": d["overall"]}}, "not an index below"),
        (lambda d: d | {"overall": d["overall"] | {"count": -1}}, "overall.count must be a non-negative"),
        (lambda d: d | {"overall": d["overall"] | {"cuont": 1}}, "unknown key 'cuont'"),
        (lambda d: d | {"by_turn": {"0": {"count": 1}}}, "by_turn.0: missing key 'sum_abs'"),
        (lambda d: {k: v for k, v in d.items() if k != "overall"}, "missing key 'overall'"),
    ],
)
def test_from_json_refuses_malformed_numerics(mutate: Any, message: str) -> None:
    good = summarize_rollout("r", [-1.0], [-1.0], [1], 0, [0], NumericsOptions(), "old_log_prob").to_json()
    with pytest.raises(ValueError, match=message):
        RolloutNumerics.from_json(mutate(good))


def test_merge_refuses_another_rollout() -> None:
    a = summarize_rollout("a", [-1.0], [-1.0], [1], 0, [0], NumericsOptions(), "old_log_prob")
    b = summarize_rollout("b", [-1.0], [-1.0], [1], 0, [0], NumericsOptions(), "old_log_prob")
    with pytest.raises(ValueError, match="rollout_id"):
        a.merge(b)


# Mutants of the module (source edits), each a defect the properties above must catch on generated rollouts.
SOURCE = Path(numerics.__file__).read_text()
MUTANTS: dict[str, list[tuple[str, str]]] = {
    "mask ignored": [("compress(trainer, mask), compress(engine, mask)", "trainer, engine")],
    "depth without the prompt": [
        ("depth = bisect_right(edges, prompt_length + a) - 1", "depth = bisect_right(edges, a) - 1")
    ],
    "turn off by one": [("turn = bisect_right(starts, a) - 1", "turn = max(bisect_right(starts, a) - 2, 0)")],
    "no depth cut at edges": [("cuts.update(e - prompt_length for e in edges if 0 < e - prompt_length < n)", "pass")],
    "k3 sign": [("sum(map(math.expm1, deltas)) - sum_delta", "sum(map(math.expm1, deltas)) + sum_delta")],
    "k3 sign on the overflow path": [("return math.expm1(delta) - delta", "return math.expm1(delta) + delta")],
    "delta engine minus trainer": [
        ("compress(trainer, mask), compress(engine, mask)", "compress(engine, mask), compress(trainer, mask)")
    ],
    "first past at the segment start": [
        ("compress(range(len(mask)), mask), k, None)", "compress(range(len(mask)), mask), 0, None)")
    ],
    "verdict on overall only": [
        ("drift_turns = [t for t, s in self.by_turn.items() if", "drift_turns = [t for t, s in {}.items() if")
    ],
    "turn and bucket share one summary": [("by_depth[depth] = seg.copy()", "by_depth[depth] = seg")],
    "absorb keeps the last first position": [
        (
            "        if other.first_past is not None:\n            self._past(other.first_past)",
            "        if other.first_past is not None:\n            self.first_past = other.first_past",
        )
    ],
}


def mutant(name: str) -> types.ModuleType:
    source = SOURCE
    for old, new in MUTANTS[name]:
        assert source.count(old) == 1, f"mutant {name!r} no longer applies: edit MUTANTS"
        source = source.replace(old, new)
    module = types.ModuleType(f"numerics_mutant_{name.replace(' ', '_')}")
    sys.modules[module.__name__] = module  # dataclasses look their module up while the class is built
    try:
        exec(compile(source, module.__name__, "exec"), module.__dict__)  # noqa: S102
    finally:
        del sys.modules[module.__name__]
    return module


def run_properties(module: types.ModuleType, seeds: range) -> None:
    # A Δ past expm1's range (~709.78) in turn 0: its k3 is infinite (as torch's exp gives), turn 1's stays exact.
    big = module.summarize_rollout(
        "r", [749.0, -801.0, -0.7], [-1.0] * 3, [1, 1, 1], 0, [0, 1], module.NumericsOptions(), "old_log_prob"
    )
    assert big.by_turn[0].sum_k3 == math.inf
    assert math.isclose(big.by_turn[1].sum_k3, (math.exp(-800) + 800 - 1) + (math.exp(0.3) - 0.3 - 1))
    # A NaN beside a finite Δ: the NaN is counted apart, the other token's k3 summed token by token.
    nan = module.summarize_rollout(
        "r", [math.nan, -0.7], [-1.0] * 2, [1, 1], 0, [0], module.NumericsOptions(), "refeed"
    )
    assert (nan.overall.nonfinite, nan.overall.count) == (1, 1)
    assert math.isclose(nan.overall.sum_k3, math.exp(0.3) - 0.3 - 1)
    for seed in seeds:
        # every fourth rollout long (turns of up to 3,000 tokens): segments cut at CHUNK, several per turn
        r = make_rollout(random.Random(seed), max_turn_tokens=3000 if seed % 4 == 0 else 300)
        assert_matches_oracle(r, summarize(r, module))
        if r.trained:
            start = r.trained[len(r.trained) // 2]
            v = summarize(drift_from(r, [i for i in r.trained if i >= start], big_drift(r)), module).verdict(r.options)
            want = ("drift", r.turn_of(start), r.bucket_of(start), r.prompt_length + start)
            assert (v.status, v.turn, v.depth_bucket, v.position) == want


def test_the_properties_pass_on_the_real_module() -> None:
    run_properties(numerics, range(40))


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_each_mutant_is_caught(name: str) -> None:
    module = mutant(name)
    with pytest.raises(Exception):  # noqa: B017, PT011  # a failed property, or a mutant that crashes on them
        run_properties(module, range(40))
