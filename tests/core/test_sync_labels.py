"""The weight label's meaning per trainer (core.sync_labels), proved over generated trainer schedules: a simulated
trainer of each convention syncs and updates as verl's does, and the lag computed from (label, trained step) equals
the updates the simulation counted between the serving and the training weights."""

from __future__ import annotations

import random

import pytest

from verl_ext.core.sync_labels import SyncLabel, lag, next_trained_step, updates_in


def simulate(sync: SyncLabel, steps: int) -> list[tuple[int, int, int, int]]:
    """(label, trained_step, updates in the serving weights, updates in the training weights) per trained batch, as
    verl's trainers run: AFTER_UPDATE (v0/v1 sync: sync 0, then per step generate, update, sync k) and BEFORE_UPDATE
    (one_step_off_policy: sync 0, generate batch 1; per step k: await batch k, sync k, generate batch k + 1, update)."""
    updates, label, out = 0, 0, []
    if sync is SyncLabel.AFTER_UPDATE:
        for k in range(1, steps + 1):
            served = (label, updates)
            out.append((served[0], k, served[1], updates))  # trained by the weights before step k's update
            updates += 1
            label = k
        return out
    pending = (label, updates)  # batch 1, generated on the first sync
    for k in range(1, steps + 1):
        batch = pending
        label = k  # sync at the start of step k, before its update
        pending = (label, updates)
        out.append((batch[0], k, batch[1], updates))
        updates += 1
    return out


@pytest.mark.parametrize("sync", list(SyncLabel))
def test_lag_is_the_updates_between_serving_and_training_weights(sync: SyncLabel) -> None:
    rng = random.Random(0)
    for _ in range(50):
        for label, trained, served_updates, trained_updates in simulate(sync, rng.randint(1, 40)):
            assert updates_in(label, sync) == served_updates
            assert lag(label, trained, sync) == trained_updates - served_updates
            assert next_trained_step(label) == trained  # both conventions train label L at step L + 1


def test_one_step_off_is_one_behind_from_step_2_and_sync_is_on_policy() -> None:
    assert [lag(label, k, SyncLabel.BEFORE_UPDATE) for label, k, *_ in simulate(SyncLabel.BEFORE_UPDATE, 5)] == [
        0,
        1,
        1,
        1,
        1,
    ]
    assert {lag(label, k, SyncLabel.AFTER_UPDATE) for label, k, *_ in simulate(SyncLabel.AFTER_UPDATE, 5)} == {0}


def test_mutation_reading_one_step_off_labels_as_after_update_hides_the_lag() -> None:
    """Mutation: treating one_step_off_policy's labels as the synchronous trainers' (what ``trained_step - label -
    1`` does) reads every batch as on-policy; the convention-aware lag does not."""
    runs = simulate(SyncLabel.BEFORE_UPDATE, 6)
    assert {lag(label, k, SyncLabel.AFTER_UPDATE) for label, k, *_ in runs} == {0}
    assert {lag(label, k, SyncLabel.BEFORE_UPDATE) for label, k, *_ in runs} == {0, 1}


def test_bad_labels_and_steps_are_refused() -> None:
    with pytest.raises(ValueError, match="label is a trainer step"):
        updates_in(-1, SyncLabel.AFTER_UPDATE)
    with pytest.raises(ValueError, match="counts from 1"):
        lag(0, 0, SyncLabel.AFTER_UPDATE)
