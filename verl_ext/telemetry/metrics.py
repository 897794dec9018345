"""Aggregate check results into a flat dict of ``tito/`` metrics for verl's tracker (one dict per step)."""

from __future__ import annotations

from collections.abc import Iterable

from verl_ext.check.findings import Cause, CheckResult, FailureKind
from verl_ext.core.trajectory import RepairKind

PREFIX = "tito/"


def aggregate(results: Iterable[CheckResult]) -> dict[str, float]:
    """Every metric is present (zero when nothing happened), so trackers draw continuous lines.

    - ``tito/rollouts_checked``, ``tito/template_view_rollouts``
    - ``tito/check_skipped``: rollouts whose template view ran past its time budget and stopped (reason in the
      rollout's record and in the log)
    - ``tito/engine_view_failures``: failures summed over rollouts; must be 0
    - ``tito/engine_view/<kind>``: those failures per kind (``id_out_of_vocab``, ``logprob_not_finite``, ``nan_stop``,
      ... for invalid engine output; ``stream``, ``mask``, ... for a rollout that changed the engine's tokens)
    - ``tito/findings/<cause>``: findings per cause, summed
    - ``tito/repairs/<kind>``: edit-log entries per kind, summed
    - ``tito/defect_rate``: rollouts with an engine failure or a defect / rollouts checked
    - ``tito/truncated_rollouts``, ``tito/lost_sampled_tokens``
    - ``tito/check_seconds_mean``, ``tito/check_seconds_max``
    """
    results = list(results)
    m: dict[str, float] = {
        f"{PREFIX}rollouts_checked": float(len(results)),
        f"{PREFIX}template_view_rollouts": float(sum(r.template_view for r in results)),
        f"{PREFIX}check_skipped": float(sum(bool(r.template_view_skipped) for r in results)),
        f"{PREFIX}engine_view_failures": float(sum(len(r.engine_failures) for r in results)),
        f"{PREFIX}rollouts_with_defects": float(sum(not r.ok for r in results)),
        f"{PREFIX}defect_rate": sum(not r.ok for r in results) / len(results) if results else 0.0,
        f"{PREFIX}truncated_rollouts": float(sum(r.truncated for r in results)),
        f"{PREFIX}lost_sampled_tokens": float(sum(r.lost_sampled_tokens for r in results)),
        f"{PREFIX}sampled_tokens": float(sum(r.num_sampled for r in results)),
        f"{PREFIX}check_seconds_mean": sum(r.seconds for r in results) / len(results) if results else 0.0,
        f"{PREFIX}check_seconds_max": max((r.seconds for r in results), default=0.0),
    }
    for kind in FailureKind:
        m[f"{PREFIX}engine_view/{kind.value}"] = 0.0
    for cause in Cause:
        m[f"{PREFIX}findings/{cause.value}"] = 0.0
    for kind in RepairKind:
        m[f"{PREFIX}repairs/{kind.value}"] = 0.0
    for r in results:
        for failure in r.engine_failures:
            m[f"{PREFIX}engine_view/{failure.kind.value}"] += 1
        for cause, n in r.cause_counts().items():
            m[f"{PREFIX}findings/{cause}"] += n
        for kind, n in r.repairs.items():
            m[f"{PREFIX}repairs/{kind}"] = m.get(f"{PREFIX}repairs/{kind}", 0.0) + n
    return m
