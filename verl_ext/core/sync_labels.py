"""What the weight version a rollout engine reports means under each of verl's trainers, and the staleness it implies.

verl labels every weight sync with the trainer's ``global_steps`` at the moment it syncs, and the engine reports that
label with each output (``extra_fields["global_steps"]``; ``weight_version`` in verl_ext's engine report). The label
is not the same quantity under every trainer, because trainers sync at different points of a step:

* ``AFTER_UPDATE``: the v0 and v1 synchronous trainers, the v1 trainer's ``colocate_async`` mode and
  ``fully_async_policy`` sync *after* step ``k``'s update with label ``k`` (the first sync, before any update,
  carries 0): label ``L`` means weights with ``L`` updates. A rollout served on ``L`` is trained at step ``L + 1``
  (on-policy, lag 0) or later (asynchronous trainers, lag = the steps in between).
* ``BEFORE_UPDATE``: ``one_step_off_policy`` syncs at the *start* of step ``k`` (after step ``k - 1``'s update,
  before step ``k``'s) with label ``k``, then starts generating the batch that step ``k + 1`` trains; the first sync,
  before step 1, carries 0 and serves step 1's batch. Label ``L`` then means weights with ``max(L - 1, 0)`` updates,
  and a rollout served on ``L`` is still trained at step ``L + 1``, by weights one update newer (lag 1) from step 2 on.

So ``trained_step - label`` is 1 for every rollout under both conventions, and only the convention tells whether the
trainer trained on the weights that sampled (lag 0) or on weights one update newer (lag 1). Steps count from 1, as
verl's do; the weights step ``k`` trains have had ``k - 1`` updates.
"""

from __future__ import annotations

from enum import Enum


class SyncLabel(str, Enum):
    """When a trainer syncs the weights relative to its step's update (which the sync's label then counts)."""

    AFTER_UPDATE = "after_update"
    BEFORE_UPDATE = "before_update"


def updates_in(label: int, sync: SyncLabel) -> int:
    """How many optimizer updates the weights synced with ``label`` have had."""
    if label < 0:
        raise ValueError(f"a weight sync's label is a trainer step (>= 0), got {label}")
    return label if sync is SyncLabel.AFTER_UPDATE else max(label - 1, 0)


def next_trained_step(label: int) -> int:
    """The first step that can train a rollout served on ``label`` (under both conventions: module docstring)."""
    return label + 1


def lag(label: int, trained_step: int, sync: SyncLabel) -> int:
    """How many updates the weights step ``trained_step`` trains have had beyond the weights that served ``label``
    (0: on-policy; 1: one step off). Negative means the rollout was trained before it could have been served: a
    wrong step or label, which a check reports."""
    if trained_step < 1:
        raise ValueError(f"a trained step counts from 1, got {trained_step}")
    return (trained_step - 1) - updates_in(label, sync)
