"""The end of a session: each branch is finished, checked by the consistency check and written as a record.

A branch is one rollout, judged by the same rollout runtime as the built-in agent loop's rollouts
(``RolloutRuntime.judge``: the engine view always and the template view at the policy's rate, nothing when the check
is off; a record that cannot be written is counted, never raised), so ``verl-ext report`` reads its record. The
record's ``extra["gateway"]`` names the session, the branch, why the session ended and, for a fork, its parent
and cause (which message, which field); a branch with images holds them as digests in its messages and the image
view's evidence in ``extra["images"]``, as the built-in loop's records do (and its result the images a trainer gets,
``multi_modal_data``: the list that evidence was computed from); where a trainer takes the branch (the
agent loop passes its ``BranchTraining``), ``trains`` says which of its engine turns are trained in it
(verl_ext.gateway.training).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_ext.check.findings import CheckResult
from verl_ext.check.inputs import trainer_sample_from_trajectory
from verl_ext.check.record import Rollout
from verl_ext.core.image_trajectory import ImageTrajectory
from verl_ext.core.trajectory import TokenTrajectory
from verl_ext.gateway.branch import Branch
from verl_ext.gateway.training import BranchTraining, trained_mask
from verl_ext.runtime import RolloutRuntime
from verl_ext.runtime.images import image_sample
from verl_ext.runtime.rollout_runtime import WRITE_FAILURES


@dataclass(frozen=True)
class BranchResult:
    """One concluded branch: its rollout (what a trainer would get) and the check's verdict on it; with a training
    decision, the response mask a trainer trains (the rollout's, less the turns another branch trains) and the
    finished trajectory it was cut from."""

    session: str
    branch: int
    rollout: Rollout
    result: CheckResult
    trained_mask: tuple[int, ...] | None = None  # None: no trainer's decision was passed (the standalone gateway)
    trajectory: TokenTrajectory | None = field(default=None, repr=False, compare=False)
    record_failed: bool = False  # a records writer was given and this branch's record could not be written
    # the images a trainer gets with the sample ({"images": [...]}: every image whose placeholder run the sample
    # holds, in order; None without): the very list whose digests the record's image evidence holds
    multi_modal_data: dict[str, list[Any]] | None = field(default=None, repr=False, compare=False)

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
    chat_template_kwargs: Mapping[str, Any] | None = None,
    training: BranchTraining | None = None,
) -> tuple[Rollout, dict[str, list[Any]] | None] | None:
    """Finish the branch's trajectory and build its rollout, with the images a trainer gets with its sample
    (``multi_modal_data``, None without images); None for a branch the engine never answered (nothing in it was
    sampled, so nothing in it can be trained on). ``training``: what a trainer trains of it, written as
    ``gateway.trains``."""
    t = branch.trajectory
    t.finish()
    if not branch.calls:
        return None
    sample = trainer_sample_from_trajectory(t, response_length)
    messages: Any = t.messages
    images: dict[str, Any] = {}
    multi_modal_data = None
    pixels: dict[str, Any] = {}
    if isinstance(t, ImageTrajectory):  # no image cut in two; the record holds digests, the image view's evidence
        cut = image_sample(t, response_length)
        sample, messages, images, pixels = cut.sample, cut.record_messages, {"images": cut.record_images}, cut.pixels
        multi_modal_data = cut.multi_modal_data
    gateway: dict[str, Any] = {"session": session_id, "branch": branch.number, "ended": ended}
    if branch.fork is not None:
        gateway["fork"] = branch.fork.to_json()
    if training is not None:
        gateway["trains"] = training.to_json(sum(trained_mask(t, sample, training.turns)))
    rollout = Rollout.of(
        branch.calls,
        sample,
        messages,
        branch.tools,
        prompt_messages=len(branch.first_messages),
        response_length=response_length,
        chat_template_kwargs=chat_template_kwargs,
        template_clock=t.clock,  # the time the branch's template read: the check and replay render with it
        kinds=[k.value for k in t.kinds[: len(sample.stream)]],
        repairs=Counter(e.kind.value for e in t.edits),
        repair_log=t.repair_log(),
        extra={"data_source": "gateway", "index": session_id, "gateway": gateway, **images},
        pixels=pixels,
    )
    return rollout, multi_modal_data


def conclude_branch(
    branch: Branch,
    session_id: str,
    ended: str,
    runtime: RolloutRuntime,
    counters: Counter[str],
    *,
    response_length: int | None,
    training: BranchTraining | None = None,
) -> BranchResult | None:
    """Judge one branch (``RolloutRuntime.judge``: check it, write its record; a failed write is counted in
    ``counters``); None when it holds no engine call. ``training``: what a trainer trains of the branch (recorded,
    and its mask in the result)."""
    built = branch_rollout(
        branch,
        session_id,
        ended,
        response_length=response_length,
        chat_template_kwargs=runtime.renderer.template_kwargs,
        training=training,
    )
    if built is None:
        return None
    rollout, multi_modal_data = built
    failures = counters[WRITE_FAILURES]
    result = runtime.judge(rollout, counters)
    mask = None if training is None else trained_mask(branch.trajectory, rollout.sample, training.turns)
    failed = counters[WRITE_FAILURES] > failures
    return BranchResult(session_id, branch.number, rollout, result, mask, branch.trajectory, failed, multi_modal_data)
