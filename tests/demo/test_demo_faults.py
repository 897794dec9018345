"""The CPU engine's TEST ONLY faults, per row and per step, through the demo's real trainer (verl's v1 GRPO trainer,
Ray, FSDP2 on gloo): one start, two steps, the faults set by the demo's one override (verl_ext/demo/faults.py), read
by the CPU replica (``CPURolloutReplica.launch_servers``) in the real Ray run. The numerics view must localize each:

- row 0 (step 1): logprobs shifted past depth ``DEPTH`` and rounded through bf16: the depth bucket from ``DEPTH``
  drifts, from the first trained position at or past it; the bucket below reads bf16 rounding, far above the clean
  baseline and below the threshold;
- row 6 (step 1): logprobs shifted in turn 1 only: turn 1 drifts from its first sampled token, turn 0 is clean;
- step 2: the engine serves step 1's weights (the sync after step 1 not applied): every rollout of step 2 reads a
  gap far above step 1's clean baseline, with no reported-number fault on its rows.

The demo's shuffled row order puts rows 0 and 6 in step 1 and rows 7 and 3 in step 2 (verl's seeded sampler); the
test asserts that order first, so a change in it fails by name, not as a missed fault."""

from __future__ import annotations

import json
from typing import Any

import pytest

from verl_ext.core.numerics import NumericsOptions, RolloutNumerics
from verl_ext.demo.faults import bf16, fault_override, on_row, past_depth, row_question, stale_on_step, turn
from verl_ext.demo.run import DemoResult, run_demo

pytestmark = [pytest.mark.timeout(1200), pytest.mark.xdist_group("ray")]

DEPTH = 280  # inside the demo's second turn (prompt ~218 tokens, turn 0 ~23 sampled, turn 1 from ~255)
EDGES = (0, DEPTH)  # the bucket edge at the fault's depth: a bucket is all clean or all shifted
SHIFT = -1.0  # every shifted token passes the per-token 0.5 (bf16 rounding moves one by at most ~0.03)
STEP1_ROWS = {0, 6}
STEP2_ROWS = {7, 3}
BASELINE = 1e-4  # a clean rollout's mean |Δ| here is ~5e-7 (fp32 CPU engine against the fp32 CPU trainer)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    faults = [on_row(past_depth(DEPTH, SHIFT), 0), on_row(bf16(), 0), on_row(turn(1, SHIFT), 6), stale_on_step(2)]
    extra = [fault_override(faults), f"+verl_ext.numerics.depth_edges=[{EDGES[0]},{EDGES[1]}]"]
    lines: list[str] = []
    result = run_demo(tmp_path_factory.mktemp("demo-faults"), steps=2, extra_overrides=extra, say=lines.append)
    assert result.returncode == 0, "\n".join(lines)
    return result


def _records(result: DemoResult) -> tuple[list[dict[str, Any]], dict[str, RolloutNumerics]]:
    lines = [json.loads(x) for f in (result.out / "records").glob("*.jsonl") for x in f.read_text().splitlines()]
    rollouts = [r for r in lines if r["type"] == "rollout"]
    numerics = {r["rollout_id"]: RolloutNumerics.from_json(r["numerics"]) for r in lines if r["type"] == "numerics"}
    return rollouts, numerics


def _row(record: dict[str, Any]) -> int:
    question = next(m["content"] for m in record["messages"] if m["role"] == "user")
    return next(i for i in range(8) if row_question(i) == question)


def _trained(record: dict[str, Any]) -> list[int]:
    return [i for i, m in enumerate(record["loss_mask"]) if m]


def _turn_starts(record: dict[str, Any]) -> list[int]:
    """Absolute positions where each run of trained tokens (an engine call's sampled tokens) starts."""
    mask = record["loss_mask"]
    return [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]


def test_each_fault_is_localized_to_its_bucket_turn_and_step(faulty: DemoResult) -> None:
    rollouts, numerics = _records(faulty)
    options = NumericsOptions(depth_edges=EDGES)
    assert {(r["step"], _row(r)) for r in rollouts} == {(1, i) for i in STEP1_ROWS} | {(2, i) for i in STEP2_ROWS}
    assert sorted(numerics) == sorted(r["rollout_id"] for r in rollouts)  # every rollout measured
    assert all(r["check"]["engine_ok"] for r in rollouts)  # the tokens are the engine's: numbers compared
    clean_turn0 = []
    for record in rollouts:
        n = numerics[record["rollout_id"]]
        v = n.verdict(options)
        row = _row(record)
        if row == 0:  # past DEPTH (and bf16 everywhere)
            assert v.status == "drift" and v.depth_bucket == 1, v
            assert v.position == next(p for p in _trained(record) if p >= DEPTH)
            assert abs(n.by_depth[1].mean_delta + SHIFT) < 0.05  # Δ = trainer - engine: -shift, beside bf16 rounding
            assert BASELINE < n.by_depth[0].mean_abs < options.drift_mean_abs_delta  # bf16's rounding only
        elif row == 6:  # turn 1 only
            assert v.status == "drift" and v.turn == 1, v
            assert v.position == _turn_starts(record)[1] == record["engine_calls"][1]["prompt_length"]
            assert abs(n.by_turn[1].mean_delta + SHIFT) < 1e-3 and n.by_turn[0].mean_abs < BASELINE
            clean_turn0.append(n.by_turn[0].mean_abs)
        else:  # step 2: stale weights, no reported-number fault
            assert record["step"] == 2
            assert n.overall.mean_abs > BASELINE, n.overall  # the engine sampled and scored on step 1's weights
    assert clean_turn0 and max(clean_turn0) < BASELINE
    # step 1's metrics: both rows' two samples drift (rows 0 and 6, n=2), turn 1 and the bucket from DEPTH worst;
    # step 2's: the stale gap in every rollout, none at the per-token threshold (no reported-number fault)
    steps = faulty.steps
    assert steps[1]["tito/numerics/drift_rollouts"] == 4 and steps[1]["tito/numerics/rollouts"] == 4
    assert steps[1]["tito/numerics/depth/0-280/mean_abs_delta"] < steps[1]["tito/numerics/depth/280+/mean_abs_delta"]
    assert steps[2]["tito/numerics/rollouts"] == 4 and steps[2]["tito/numerics/mean_abs_delta"] > BASELINE
    print("stale step 2:", {k: steps[2][f"tito/numerics/{k}"] for k in ("mean_abs_delta", "max_abs_delta")})
