"""Which trainer a rollout runs under (plugin.trainer_mode), read from verl's real composed configs, and the record's
``trainer`` entry: the served label, the lag and the whole-rollout check, on verl_ext_tool_agent's real rollout path
(the CPU engine serving a weight label, as one_step_off_policy's sync leaves it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from loop_harness import run_loop, verl_config

from verl_ext.engines.forced_turn import FORCED_TOOL_CALL
from verl_ext.plugin import metrics_sink
from verl_ext.plugin.trainer_mode import (
    FULLY_ASYNC,
    MIXED_LABELS,
    ONE_STEP_OFF,
    UNEXPECTED_LAG,
    UNLABELLED,
    V0_SYNC,
    TrainerMode,
)

# one_step_off_policy's own config keys over verl's ppo_trainer (its one_step_off_ppo_trainer.yaml), as
# docs/async.md's command passes them
ONE_STEP_OFF_KEYS = ["trainer.use_v1=false", "actor_rollout_ref.hybrid_engine=false", "+rollout.nnodes=1"]
PROMPT = [{"role": "user", "content": "What is 12*7? Use the calculator tool."}]


def fully_async_config():
    import verl.experimental.fully_async_policy as fa
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(fa.__file__).parent / "config"), version_base=None):
        return compose(config_name="fully_async_ppo_trainer")


def test_the_trainer_is_read_from_verls_configs() -> None:
    assert TrainerMode.of(verl_config(ONE_STEP_OFF_KEYS)).name == ONE_STEP_OFF
    assert TrainerMode.of(verl_config(ONE_STEP_OFF_KEYS)).sync.value == "before_update"
    assert TrainerMode.of(verl_config(["trainer.use_v1=false"])).name == V0_SYNC
    assert TrainerMode.of(verl_config(["trainer.use_v1=true"])).name == "v1:sync"
    mode = TrainerMode.of(verl_config(["trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async"]))
    assert mode.name == "v1:colocate_async" and mode.sync.value == "after_update"
    fully_async = TrainerMode.of(fully_async_config())
    assert fully_async.name == FULLY_ASYNC
    # its trainer takes rollouts from a queue later: no lag is claimed for them when they are generated
    assert fully_async.rollout_staleness([2, 2], 3) == {
        "mode": FULLY_ASYNC,
        "sync": "after_update",
        "served": 2,
        "lag": None,
        "problem": None,
    }


@pytest.mark.parametrize(
    ("served", "step", "lag", "problem"),
    [
        ([0, 0, 0], 1, 0, None),  # step 1's batch: served on the first sync, trained before any update
        ([4, 4], 5, 1, None),  # one step off
        ([4, 5], 6, 2, MIXED_LABELS),  # mutation: a sync inside the rollout (one_step_off never aborts)
        ([3, 3], 5, 2, UNEXPECTED_LAG),  # mutation: two steps off
        ([4, None], 5, 1, UNLABELLED),  # a turn the engine did not label
        ([], 1, None, UNLABELLED),
    ],
)
def test_one_step_off_whole_rollout_check(served: list, step: int, lag: int | None, problem: str | None) -> None:
    entry = TrainerMode.of(verl_config(ONE_STEP_OFF_KEYS)).rollout_staleness(served, step)
    assert entry["lag"] == lag and entry["problem"] == problem
    assert entry["served"] == (served[0] if served and len(set(served)) == 1 and None not in served else None)


def test_mutation_the_sync_convention_is_what_shows_the_lag() -> None:
    """Mutation: one_step_off_policy's rollout read as a synchronous trainer's (after-update labels): the same
    labels say on-policy; the v0 check then calls a one-step lag wrong, and a fresh one right."""
    v0 = TrainerMode.of(verl_config(["trainer.use_v1=false"]))
    assert v0.rollout_staleness([4, 4], 5)["lag"] == 0
    assert v0.rollout_staleness([3, 3], 5)["problem"] == UNEXPECTED_LAG


@pytest.mark.timeout(300)
def test_a_one_step_off_rollout_records_its_served_label_and_lag(make_loop, tmp_path) -> None:
    """verl_ext_tool_agent under one_step_off_policy's config, on the CPU engine serving the weights synced at the
    start of step 3 (label 3): the rollout is trained at step 4, one update later; the record and the metrics say
    so; no problem. The version spans read the same lag (the record's versions carry the convention): staleness 1,
    and ``max_token_lag: 0`` masks every sampled token (the after-update reading would call them on-policy)."""
    loop, server = make_loop(
        force_text=FORCED_TOOL_CALL,
        verl_ext={"records": {"dir": str(tmp_path)}, "max_token_lag": 0},
        extra=ONE_STEP_OFF_KEYS,
    )
    loop.loop.run_until_complete(server.server.set_global_steps(3))
    metrics_sink.drain()
    run_loop(loop, PROMPT)
    metrics = metrics_sink.drain()
    (record,) = [
        json.loads(x) for f in tmp_path.glob("*.jsonl") for x in f.read_text().splitlines() if '"rollout"' in x
    ]
    assert len(server.requests) >= 2  # the forced call, its answer: every turn labelled
    assert record["step"] == 4
    assert record["trainer"] == {"mode": ONE_STEP_OFF, "sync": "before_update", "served": 3, "lag": 1, "problem": None}
    assert metrics["tito/trainer/lagged_rollouts"] == 1 and metrics["tito/trainer/lag_sum"] == 1
    assert not any(k.startswith("tito/trainer/") and k.endswith(UNEXPECTED_LAG) for k in metrics)
    assert record["versions"]["sync"] == "before_update" and record["versions"]["trained_step"] == 4
    sampled = metrics["tito/async/versioned_tokens"]
    assert sampled > 0 and metrics["tito/async/tokens_lag_1"] == sampled and metrics["tito/async/staleness_mean"] == 1
    assert metrics["tito/async/masked_stale_tokens"] == sampled
