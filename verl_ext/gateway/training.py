"""Which engine turns of a session's branches a trainer trains: each engine call in exactly one branch.

A fork replays its parent's turns up to the fork point: the child holds the same ``EngineCall`` objects, so two
branches can hold one call. With ``branches: last`` only the session's last branch is trained (it holds every call
it replayed). With ``branches: all`` every trainable branch is, and a call held by several is trained in the last of
them only: in each earlier branch its sampled tokens stay in the stream as context, masked out of the loss. A call
is one sample even when another call sampled the same ids (a retried request), so holding is object identity.

``plan_training`` decides per branch (``BranchTraining``, written into the branch's record); ``trained_mask`` turns
a decision into the trainer's response mask; ``trained_count`` counts, per engine-sampled token, the samples that
train it (each must be 1), which the loop checks before handing verl its samples.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.check.inputs import EngineCall, TrainerSample
from verl_ext.core.trajectory import TokenKind, TokenTrajectory
from verl_ext.gateway.branch import Branch

TRAIN_MODES = ("last", "all")


@dataclass(frozen=True)
class BranchTraining:
    """What a trainer trains of one branch: its engine turns (indices into its calls) trained here, and each turn a
    later branch trains instead (``(turn, branch)``); ``untrained`` says why nothing of it is trained, when so."""

    turns: tuple[int, ...]
    elsewhere: tuple[tuple[int, int], ...] = ()
    untrained: str | None = None

    def to_json(self, tokens: int) -> dict[str, Any]:
        """The record's ``gateway.trains`` object; ``tokens``: the sampled tokens the branch's sample trains."""
        out: dict[str, Any] = {"turns": list(self.turns), "tokens": tokens}
        if self.elsewhere:
            out["elsewhere"] = [{"turn": t, "branch": b} for t, b in self.elsewhere]
        if self.untrained is not None:
            out["untrained"] = self.untrained
        return out


def plan_training(
    branches: Sequence[Branch], mode: str, untrainable: Mapping[int, str] | None = None
) -> dict[int, BranchTraining]:
    """Per branch number, what is trained (module docstring). ``branches``: the session's, in order (those without
    an engine call are skipped: they are not rollouts). ``untrainable``: branch number -> why it cannot be trained
    (its prompt is too long for the trainer, the harness failed). The session's reward is its last branch's, so when
    the last branch cannot be trained nothing of the session is."""
    if mode not in TRAIN_MODES:
        raise ValueError(f"branches must be one of {', '.join(TRAIN_MODES)}, got {mode!r}")
    untrainable = dict(untrainable or {})
    rollouts = [b for b in branches if b.calls]
    if not rollouts:
        return {}
    last = rollouts[-1]
    if last.number in untrainable:
        why = untrainable[last.number]
        return {
            b.number: BranchTraining(
                (),
                untrained=untrainable.get(b.number)
                or f"the session's last branch ({last.number}), whose reward is the session's, is not trained: {why}",
            )
            for b in rollouts
        }
    if mode == "last":
        plan = {
            b.number: BranchTraining((), untrained=f"branches=last trains the session's last branch ({last.number})")
            for b in rollouts[:-1]
        }
        plan[last.number] = BranchTraining(tuple(range(len(last.calls))))
        return plan
    owner: dict[int, Branch] = {}  # id(call) -> the last trainable branch holding it
    for branch in rollouts:
        if branch.number not in untrainable:
            for call in branch.calls:
                owner[id(call)] = branch
    plan = {}
    for branch in rollouts:
        turns, elsewhere = [], []
        for turn, call in enumerate(branch.calls):
            holder = owner.get(id(call))
            if holder is branch:
                turns.append(turn)
            elif holder is not None:
                elsewhere.append((turn, holder.number))
        why = untrainable.get(branch.number)
        if why is None and not turns:
            why = "every turn of it is trained in a later branch"
        plan[branch.number] = BranchTraining(tuple(turns), tuple(elsewhere), why)
    return plan


def trained_mask(trajectory: TokenTrajectory, sample: TrainerSample, turns: Sequence[int]) -> tuple[int, ...]:
    """The sample's response mask with the sampled tokens of every engine turn not in ``turns`` set to 0.
    ``trajectory`` is the finished one ``sample`` was cut from (``trainer_sample_from_trajectory``)."""
    keep = set(turns)
    start = len(sample.prompt_ids)
    turn_of = trajectory.turn_of
    return tuple(m if m and turn_of[start + i] in keep else 0 for i, m in enumerate(sample.response_mask))


def trained_count(samples: Sequence[tuple[Sequence[EngineCall], TokenTrajectory, Sequence[int]]]) -> Counter[Any]:
    """How many of a session's samples train each engine-sampled token: ``(id(call), output position) -> count``,
    over every sampled token inside some sample's response (0 where none trains it). Each sample is its branch's
    calls, its finished trajectory and its trained response mask. A trained token that is not a sampled one raises
    ``ValueError``."""
    counts: Counter[Any] = Counter()
    for calls, trajectory, mask in samples:
        start = trajectory.turns[0].prompt_length
        kinds, turn_of = trajectory.kinds, trajectory.turn_of
        for i, m in enumerate(mask):
            at = start + i
            if kinds[at] is not TokenKind.SAMPLED:
                if m:
                    raise ValueError(f"stream position {at} is trained but is a {kinds[at].value} token")
                continue
            record = trajectory.turns[turn_of[at]]
            key = (id(calls[record.index]), at - record.sampled_start)
            counts[key] += 1 if m else 0
    return counts
