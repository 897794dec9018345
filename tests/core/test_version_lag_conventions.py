"""One lag definition: the version spans' staleness, the ``tito/async/`` lag counters and the ``max_token_lag`` mask
read a token's lag with the trainer's sync convention (``RolloutVersions.sync``, ``core.sync_labels.lag``), proved
over generated trainer schedules of both conventions (``test_sync_labels.simulate``: the updates a simulated trainer
counted between the weights that served a batch and those that train it are the truth)."""

from __future__ import annotations

import random

import pytest
from test_sync_labels import simulate

from verl_ext.core import version_spans
from verl_ext.core.sync_labels import SyncLabel
from verl_ext.core.version_spans import Attempt, RolloutVersions, stale_mask
from verl_ext.telemetry.async_metrics import version_counters


def _rollout(rng: random.Random, label: int, trained: int, sync: SyncLabel) -> tuple[RolloutVersions, list[int]]:
    """A rollout of 1-4 turns served on ``label`` (no abort: one sync per batch), and each turn's output length."""
    lengths = [rng.randint(1, 12) for _ in range(rng.randint(1, 4))]
    calls = tuple((Attempt(label, 0, n, label),) for n in lengths)
    return RolloutVersions(calls, trained_step=trained, sync=sync), lengths


def wrong_readings(sync: SyncLabel, seed: int = 5) -> list[str]:
    """Where the staleness, the counters or the mask disagree with the simulated schedules' lag (empty: none)."""
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(40):
        for label, trained, served_updates, trained_updates in simulate(sync, rng.randint(1, 30)):
            truth = trained_updates - served_updates
            versions, lengths = _rollout(rng, label, trained, sync)
            tokens = sum(lengths)
            back = RolloutVersions.from_json(versions.to_json())  # the record's form keeps the convention
            st = back.staleness()
            if (st.mean, st.max_lag, st.tokens, st.unknown) != (truth, truth, tokens, 0):
                out.append(f"{sync.value} label {label} step {trained}: staleness {st}, truth {truth}")
            c = version_counters(back)
            if c["async/lag_token_sum"] != truth * tokens or c[f"async/tokens_lag_{min(truth, 3)}"] != tokens:
                out.append(f"{sync.value} label {label} step {trained}: counters {dict(c)}, truth {truth}")
            starts, at = [], 0
            for n in lengths:  # each turn's output, then a 2-token reply, in one response
                starts.append(at)
                at += n + 2
            mask = [1] * at
            kept, none = stale_mask(back, starts, mask, 0, truth)
            masked, n_masked = stale_mask(back, starts, mask, 0, truth - 1) if truth else (None, 0)
            if kept is not None or none or (truth and (n_masked != tokens or masked is None)):
                out.append(f"{sync.value} label {label} step {trained}: mask {n_masked} of {tokens}, truth {truth}")
    return out


@pytest.mark.parametrize("sync", list(SyncLabel))
def test_staleness_counters_and_mask_read_the_trainers_convention(sync: SyncLabel) -> None:
    assert wrong_readings(sync) == []


def test_mutation_the_after_update_formula_under_one_step_off_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation: the lag read the after-update way whatever the trainer (``trained_step - version - 1``, what
    version_spans did before it carried the convention): one_step_off_policy's batches read one lag too low."""
    monkeypatch.setattr(version_spans, "lag", lambda label, trained_step, sync: trained_step - label - 1)
    assert wrong_readings(SyncLabel.AFTER_UPDATE) == []  # the mutation is the right formula there
    wrong = wrong_readings(SyncLabel.BEFORE_UPDATE)
    assert wrong and all(w.startswith("before_update") for w in wrong)


def test_records_without_the_convention_read_as_after_update_and_a_bad_one_is_refused() -> None:
    old = {"trained_step": 4, "calls": [[[3, 0, 5, 3, 0, None, None, None]]]}  # a schema 7 record before "sync"
    versions = RolloutVersions.from_json(old)
    assert versions.sync is SyncLabel.AFTER_UPDATE and versions.staleness().mean == 0
    assert RolloutVersions.from_json({**old, "sync": "before_update"}).staleness().mean == 1
    with pytest.raises(ValueError, match="'versions.sync' is one of"):
        RolloutVersions.from_json({**old, "sync": "after"})


def test_no_lag_without_a_trainer_step() -> None:
    """The standalone gateway records step 0 (no trainer): its tokens have no lag, counted as unknown."""
    versions = RolloutVersions(((Attempt(0, 0, 5, 0),),), trained_step=0)
    assert versions.staleness().unknown == 5 and versions.lag(0) is None
    assert version_counters(versions)["async/unstamped_tokens"] == 5
