"""Which verl trainer a rollout runs under, read from the trainer's config, and the whole-rollout staleness it implies.

The agent loop sees verl's full config but not which trainer drives it. The trainers differ in when they sync the
weights (``core.sync_labels``), so the engine's weight label (verl's ``global_steps``) means different things:

* ``fully_async_policy``: the config has its ``async_training`` section; syncs after updates (``AFTER_UPDATE``).
* ``one_step_off_policy``: the legacy (v0) trainer without a hybrid engine (``actor_rollout_ref.hybrid_engine:
  false``: the rollout has its own pool) and no ``async_training``; syncs at a step's start (``BEFORE_UPDATE``).
* the v1 trainer (``trainer.use_v1``): ``trainer.v1.trainer_mode`` (``sync``, ``colocate_async``,
  ``separate_async``); syncs after updates. It also passes the loop the step that trains the sample.
* otherwise the v0 trainer, synchronous: syncs after updates.

``rollout_staleness`` is the record's ``trainer`` entry for one rollout: the mode, the sync convention and the
rollout's lag, with ``problem`` naming what is wrong where the labels its turns were served on do not fit the mode.
Under ``one_step_off_policy`` nothing aborts and no sync happens while a batch generates, so every turn of a rollout
must carry one label, and the lag is 1 (0 for step 1's batch, which the first sync serves).

``resumes_aborted_requests`` reads verl's ``async_training.partial_rollout`` as verl's resume client does
(``FullyAsyncLLMServerClient.generate``, verl/workers/rollout/llm_server.py): where it is false, an aborted request is
handed to the loop as it came back, never resumed. verl 0.9.1 drops nothing after that (its stock loop trains the turn
cut at the abort); verl_ext's own loops never train a half turn, so they refuse that setting
(``partial_rollout_refusal``) and the audited stock loop gets what verl's client would give it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.core.sync_labels import SyncLabel, lag

ONE_STEP_OFF = "one_step_off_policy"
FULLY_ASYNC = "fully_async_policy"
V0_SYNC = "v0"

# The record's ``trainer`` entry's problems, named.
MIXED_LABELS = "mixed_labels"  # the turns of one rollout were served on different weights
UNLABELLED = "unlabelled"  # the engine reported no weight label for some turn
UNEXPECTED_LAG = "unexpected_lag"  # the lag is not what the mode produces


@dataclass(frozen=True)
class TrainerMode:
    """A trainer's name (``ONE_STEP_OFF``, ``FULLY_ASYNC``, ``V0_SYNC``, or ``v1:<trainer_mode>``) and its sync
    convention."""

    name: str
    sync: SyncLabel

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> TrainerMode:
        """The trainer that runs with ``config`` (verl's full trainer config, as the agent loop gets it)."""
        if config.get("async_training") is not None:
            return cls(FULLY_ASYNC, SyncLabel.AFTER_UPDATE)
        trainer = config.get("trainer") or {}
        if trainer.get("use_v1", False):
            mode = (trainer.get("v1") or {}).get("trainer_mode", "sync")
            return cls(f"v1:{mode}", SyncLabel.AFTER_UPDATE)
        hybrid = (config.get("actor_rollout_ref") or {}).get("hybrid_engine", True)
        if not hybrid:
            return cls(ONE_STEP_OFF, SyncLabel.BEFORE_UPDATE)
        return cls(V0_SYNC, SyncLabel.AFTER_UPDATE)

    def expected_lags(self, trained_step: int) -> frozenset[int] | None:
        """The lags this trainer produces for a rollout trained at ``trained_step`` (None: any non-negative lag,
        as asynchronous trainers bound staleness by their own thresholds)."""
        if self.name == ONE_STEP_OFF:
            return frozenset({0 if trained_step == 1 else 1})
        if self.name in (V0_SYNC, "v1:sync"):
            return frozenset({0})
        return None

    def rollout_staleness(self, served: Sequence[Any], trained_step: int | None) -> dict[str, Any]:
        """The record's ``trainer`` entry for a rollout whose turns were served on labels ``served`` (one per turn,
        as the engine reported them) and that step ``trained_step`` trains: ``mode``, ``sync``, ``served`` (the
        label when all turns share one, else None), ``lag`` (from the oldest label) and ``problem`` (None, or one of
        ``MIXED_LABELS``, ``UNLABELLED``, ``UNEXPECTED_LAG``). Under ``fully_async_policy`` the lag is None: the
        step that trains the rollout is decided later, by the trainer."""
        labels = [_label(x) for x in served]
        known = [x for x in labels if x is not None]
        entry: dict[str, Any] = {"mode": self.name, "sync": self.sync.value, "served": None, "lag": None}
        if self.name == FULLY_ASYNC:  # the trainer takes rollouts from a queue: the step that trains one is not
            trained_step = None  # known while it is generated (the trainer's metrics say how stale they were)
        problem = None
        if len(known) < len(labels) or not known:
            problem = UNLABELLED
        if known and trained_step is None:
            entry["served"] = known[0] if len(set(known)) == 1 and problem is None else None
        elif known:
            entry["lag"] = lag(min(known), trained_step, self.sync)
            if len(set(known)) == 1:
                entry["served"] = known[0] if problem is None else None  # one label, if every turn has one
            elif self.name == ONE_STEP_OFF:  # no sync while a batch generates: one label per rollout
                problem = problem or MIXED_LABELS
            expected = self.expected_lags(trained_step)
            if problem is None and (entry["lag"] < 0 or (expected is not None and entry["lag"] not in expected)):
                problem = UNEXPECTED_LAG
        entry["problem"] = problem
        return entry

    def staleness_counters(self, entry: Mapping[str, Any]) -> dict[str, float]:
        """``staleness_counters`` of one of this trainer's entries (what ``LiveRollout.finish`` counts)."""
        return staleness_counters(entry)


def resumes_aborted_requests(config: Mapping[str, Any]) -> bool:
    """Whether verl's resume client resumes a request a weight update aborted under ``config`` (verl's full trainer
    config): always, but where an ``async_training`` section (``fully_async_policy``) sets ``partial_rollout: false``
    (its own config's default is true; the v1 trainer has no such setting and always resumes)."""
    section = config.get("async_training")
    return section is None or bool(section.get("partial_rollout", True))


def partial_rollout_refusal(config: Mapping[str, Any], loop: str) -> str | None:
    """Why ``loop`` (a verl_ext loop that builds its own turns) cannot run under ``config``, with the fix; None where
    it can: verl's ``async_training.partial_rollout: false`` hands the loop a turn cut at the abort to train."""
    if resumes_aborted_requests(config):
        return None
    return (
        f"{loop} does not run with async_training.partial_rollout=false: under it verl hands the loop a turn cut "
        "where a weight update aborted it, never resumed, and verl 0.9.1 trains it cut (nothing drops it); "
        f"{loop} never trains a half turn. Fix: async_training.partial_rollout=true (the turn is resumed on the new "
        "weights and each attempt's version recorded: docs/async.md), or run these rows under "
        "verl_ext_audited_tool_agent, which gives verl's stock loop the aborted turn as verl does"
    )


def staleness_counters(entry: Mapping[str, Any]) -> dict[str, float]:
    """The rollout's counts for the step's ``tito/`` metrics: rollouts with a known lag, their summed lag, and one
    count per problem (``tito/trainer/<problem>``)."""
    out: dict[str, float] = {}
    if entry.get("lag") is not None:
        out["trainer/lagged_rollouts"] = 1.0
        out["trainer/lag_sum"] = float(entry["lag"])
    if entry.get("problem"):
        out[f"trainer/{entry['problem']}"] = 1.0
    return out


def _label(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
