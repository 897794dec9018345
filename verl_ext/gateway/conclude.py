"""The end of a session: each branch is finished, checked by the consistency check and written as a record.

A branch is one rollout, checked exactly as the built-in agent loop's rollouts are (the engine view always; the
template view at the policy's rate) and written with the same record writer, so ``verl-ext report`` reads it. The
record's ``extra["gateway"]`` names the session, the branch, why the session ended and, for a fork, its parent
and cause (which message, which field).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from verl_ext.check.checker import ConsistencyChecker
from verl_ext.check.findings import CheckResult
from verl_ext.check.inputs import trainer_sample_from_trajectory
from verl_ext.check.record import Rollout
from verl_ext.gateway.branch import Branch
from verl_ext.telemetry.records import RecordWriter


@dataclass(frozen=True)
class BranchResult:
    """One concluded branch: its rollout (what a trainer would get) and the check's verdict on it."""

    session: str
    branch: int
    rollout: Rollout
    result: CheckResult


def branch_rollout(
    branch: Branch,
    session_id: str,
    ended: str,
    *,
    response_length: int | None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> Rollout | None:
    """Finish the branch's trajectory and build its rollout; None for a branch the engine never answered (nothing
    in it was sampled, so nothing in it can be trained on)."""
    t = branch.trajectory
    t.finish()
    if not branch.calls:
        return None
    sample = trainer_sample_from_trajectory(t, response_length)
    gateway: dict[str, Any] = {"session": session_id, "branch": branch.number, "ended": ended}
    if branch.fork is not None:
        gateway["fork"] = branch.fork.to_json()
    return Rollout.of(
        branch.calls,
        sample,
        t.messages,
        branch.tools,
        prompt_messages=len(branch.first_messages),
        response_length=response_length,
        chat_template_kwargs=chat_template_kwargs,
        kinds=[k.value for k in t.kinds[: len(sample.stream)]],
        repairs=Counter(e.kind.value for e in t.edits),
        repair_log=t.repair_log(),
        extra={"data_source": "gateway", "index": session_id, "gateway": gateway},
    )


def conclude_branch(
    branch: Branch,
    session_id: str,
    ended: str,
    checker: ConsistencyChecker,
    writer: RecordWriter | None,
    *,
    response_length: int | None,
) -> BranchResult | None:
    """Check one branch and write its record (when a writer is given); None when it holds no engine call."""
    rollout = branch_rollout(
        branch,
        session_id,
        ended,
        response_length=response_length,
        chat_template_kwargs=checker.renderer.template_kwargs,
    )
    if rollout is None:
        return None
    result = checker.check_rollout(rollout)
    if writer is not None:
        writer.write(rollout.record(result))
    return BranchResult(session_id, branch.number, rollout, result)
