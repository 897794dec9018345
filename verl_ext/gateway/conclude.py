"""The end of a session: each branch is finished, checked by the consistency check and written as a record.

A branch is one rollout (``LiveRollout``), finished and judged as the built-in agent loop's rollouts are
(``LiveRollout.finish``, ``RolloutRuntime.judge``: the engine view always and the template view at the policy's
rate, nothing when the check is off; a record that cannot be written is counted in the branch's counters, never
raised), so ``verl-ext report`` reads its record. Its step, data source and index are the session's row
(``Session.row``). The record's ``extra["gateway"]`` names the session, the branch, why the session ended and, for a
fork, its parent and cause (which message, which field); a branch with images holds them as digests in its messages
and the image view's evidence in ``extra["images"]``, as the built-in loop's records do (and its result the images a
trainer gets, ``multi_modal_data``: the list that evidence was computed from); where a trainer takes the branch (the
agent loop passes its ``BranchTraining``), ``trains`` says which of its engine turns are trained in it
(verl_ext.gateway.training).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_ext.check.findings import CheckResult
from verl_ext.check.record import Rollout
from verl_ext.core.trajectory import TokenTrajectory
from verl_ext.gateway.branch import Branch
from verl_ext.gateway.training import BranchTraining, trained_mask
from verl_ext.runtime import FinishedRollout
from verl_ext.runtime.rollout_runtime import WRITE_FAILURES


@dataclass(frozen=True)
class BranchResult:
    """One concluded branch: the finished rollout (what a trainer would get) and the check's verdict on it, and what
    its conclusion counted (``counters``: records and thumbnails not written, and under a trainer its
    ``tito/async/*`` counts); with a training decision, the response mask a trainer trains (the rollout's, less the
    turns another branch trains), the finished trajectory it was cut from and the loss mask the trainer gets."""

    session: str
    branch: int
    finished: FinishedRollout
    result: CheckResult
    trained_mask: tuple[int, ...] | None = None  # None: no trainer's decision was passed (the standalone gateway)
    trajectory: TokenTrajectory | None = field(default=None, repr=False, compare=False)
    counters: Mapping[str, int] = field(default_factory=dict)
    # the loss mask the trainer gets: ``trained_mask`` less the tokens older than max_token_lag (LiveRollout
    # .trainer_mask); what is trained and where (trained_tokens, the plan) is decided before it, never by it
    trainer_mask: tuple[int, ...] | None = None

    @property
    def rollout(self) -> Rollout:
        return self.finished.rollout

    @property
    def multi_modal_data(self) -> dict[str, list[Any]] | None:
        """The images a trainer gets with the sample (``{"images": [...]}``: every image whose placeholder run the
        sample holds, in order; None without): the very list whose digests the record's image evidence holds."""
        return self.finished.multi_modal_data

    @property
    def record_failed(self) -> bool:
        """A records writer was given and this branch's record could not be written."""
        return bool(self.counters.get(WRITE_FAILURES))

    @property
    def trained_tokens(self) -> int:
        """Sampled tokens a trainer trains in this branch (all of its sampled ones without a decision)."""
        mask = self.trained_mask if self.trained_mask is not None else self.rollout.sample.response_mask
        return sum(mask)


def branch_rollout(
    branch: Branch,
    session_id: str,
    ended: str,
    *,
    response_length: int | None,
    row: Mapping[str, Any] | None = None,
    training: BranchTraining | None = None,
) -> FinishedRollout | None:
    """Finish the branch's rollout (``LiveRollout.finish``); None for a branch the engine never answered (nothing in
    it was sampled, so nothing in it can be trained on). ``row``: the record's step, data source and index (default:
    step 0, the gateway, the session) and, under a trainer, ``trainer`` (``LiveRollout.finish``'s: the record's
    ``trainer`` entry); ``training``: what a trainer trains of it, written as ``gateway.trains``."""
    live = branch.rollout
    if not branch.calls:
        if live.trajectory is not None:
            live.trajectory.finish()
        return None
    row = {"step": 0, "data_source": "gateway", "index": session_id, **(row or {})}
    gateway: dict[str, Any] = {"session": session_id, "branch": branch.number, "ended": ended}
    if branch.fork is not None:
        gateway["fork"] = branch.fork.to_json()
    # the loop that wrote the record, by the name a user knows it by (the report picks its fix texts by it)
    loop = "verl_ext_gateway_agent" if training is not None else "verl-ext gateway"
    extra = {"loop": loop, "data_source": row["data_source"], "index": row["index"], "gateway": gateway}
    versions = branch.versions(row["step"])  # each turn's attempts, where the engine says them
    finished = live.finish(
        response_length=response_length, step=row["step"], extra=extra, versions=versions, trainer=row.get("trainer")
    )
    if training is None:
        return finished
    trains = training.to_json(sum(trained_mask(branch.trajectory, finished.sample, training.turns)))
    # what the branch trains is known once its sample is cut: its record says so
    extra = {**finished.rollout.extra, "gateway": {**gateway, "trains": trains}}
    return dataclasses.replace(finished, rollout=dataclasses.replace(finished.rollout, extra=extra))


def conclude_branch(
    branch: Branch,
    session_id: str,
    ended: str,
    counters: Counter[str],
    *,
    response_length: int | None,
    row: Mapping[str, Any] | None = None,
    training: BranchTraining | None = None,
) -> BranchResult | None:
    """Judge one branch (``LiveRollout.judge``: check it, write its record; what that counts, a failed write, goes
    to the branch's counters and to ``counters``); None when it holds no engine call. ``training``: what a trainer
    trains of the branch (recorded, and its mask in the result, with the loss mask ``LiveRollout.trainer_mask``
    gives, whose ``tito/async/*`` counts go to the same counters)."""
    finished = branch_rollout(branch, session_id, ended, response_length=response_length, row=row, training=training)
    if finished is None:
        return None
    live = branch.rollout
    mask = loss = None
    if training is not None:  # a trainer takes it: max_token_lag's mask and tito/async over the turns it trains
        mask = trained_mask(branch.trajectory, finished.sample, training.turns)
        loss = tuple(live.trainer_mask(finished, mask, training.turns))
    result = live.judge(finished)
    counters.update(live.counters)
    return BranchResult(
        session_id, branch.number, finished, result, mask, branch.trajectory, dict(live.counters), trainer_mask=loss
    )
