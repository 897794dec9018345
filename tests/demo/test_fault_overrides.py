"""The demo's TEST ONLY fault switch (verl_ext/demo/faults.py): its one override, composed with the demo's job config
as verl's trainer composes it, reaches the CPU replica's config as the faults the engine was given."""

from __future__ import annotations

from typing import Any

import pytest

from verl_ext.demo.faults import bf16, fault_override, on_row, past_depth, row_question, stale_on_step, turn
from verl_ext.demo.run import JOB_CONFIGS
from verl_ext.engines.cpu import engine_options
from verl_ext.engines.cpu_faults import Fault, parse_faults


def rollout_config(*overrides: str) -> Any:
    """The rollout config the CPU replica reads, as verl's trainer composes the demo's job config."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(JOB_CONFIGS), version_base=None):
        cfg = compose(config_name="cpu_demo", overrides=list(overrides))
    return cfg.actor_rollout_ref.rollout


def test_per_row_and_per_step_faults_reach_the_engine_in_one_override() -> None:
    faults = [on_row(past_depth(300), 0), on_row(turn(1, -0.25), 1), on_row(bf16(), 2), stale_on_step(2)]
    config = rollout_config(fault_override(faults))
    parsed = parse_faults(engine_options(config.engine_kwargs)["faults"])
    assert parsed == (
        Fault("past_depth", depth=300, shift=-0.5, rows_containing=row_question(0)),
        Fault("turn", turn=1, shift=-0.25, rows_containing=row_question(1)),
        Fault("bf16", rows_containing=row_question(2)),
        Fault("stale_weights", versions=frozenset({1})),
    )
    assert len({row_question(i) for i in range(8)}) == 8  # every training row has its own question
    assert row_question(0).startswith("What is ") and "'" not in row_question(0)


def test_without_the_override_the_engine_gets_no_faults() -> None:
    assert engine_options(rollout_config().engine_kwargs) == {}


def test_a_bad_fault_fails_before_the_trainer_starts() -> None:
    from verl_ext.core.errors import OptionsError

    with pytest.raises(OptionsError, match="shift must be a finite negative number"):
        fault_override([past_depth(10, shift=0.5)])
    with pytest.raises(ValueError, match="at least 2"):
        stale_on_step(1)
