"""Every rollout as one row of the report's list, worst first, with what the list filters on (causes, step)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from verl_ext.check.numerics_verdict import TwoPartVerdict
from verl_ext.report.examples import severity
from verl_ext.report.forks import GatewayBranch, gateway_branch
from verl_ext.report.load import RolloutRef

LIST_LIMIT = 2000  # rows in the page; the rest are counted, worst first kept


@dataclass(frozen=True)
class RolloutRow:
    """One rollout in the report's table of every rollout."""

    label: str
    step: int
    engine_failures: tuple[str, ...]  # failure kinds
    defect_causes: tuple[str, ...]
    allowed_causes: tuple[str, ...]
    findings: int
    tokens: int
    turns: int
    lost_sampled_tokens: int
    skipped: bool
    example: str | None  # anchor of its token-by-token view, when the page has one
    gateway: GatewayBranch | None = None  # its gateway session and branch (a fork's cause), for a gateway rollout
    numbers: TwoPartVerdict | None = None  # the two-part verdict's numbers half (None: the page has no numerics)

    @property
    def filter_keys(self) -> tuple[str, ...]:
        """What the list filters this row by: its causes, "engine", "truncated", "skipped", else "clean"; and
        "fork" for a branch a gateway request forked (clean or not)."""
        keys = [*self.defect_causes, *self.allowed_causes]
        keys += ["engine"] if self.engine_failures else []
        keys += ["truncated"] if self.lost_sampled_tokens else []
        keys += ["skipped"] if self.skipped else []
        fork = ["fork"] if self.gateway is not None and self.gateway.fork is not None else []
        drift = ["numbers drift"] if self.numbers is not None and self.numbers.numbers == "drift" else []
        return (*(keys or ["clean"]), *fork, *drift)

    @property
    def status(self) -> str:
        """``bad`` (engine failure or defect), ``warn`` (lost sampled tokens or a skipped check) or ``good``."""
        if self.engine_failures:
            return "bad"
        return "bad" if self.defect_causes else ("warn" if self.lost_sampled_tokens or self.skipped else "good")


def rollout_rows(
    rollouts: Sequence[RolloutRef], examples: Mapping[str, str], numbers: Mapping[str, TwoPartVerdict] | None = None
) -> tuple[list[RolloutRow], int]:
    """Rows worst first (ties in file order) and how many were left out past ``LIST_LIMIT``.
    ``examples``: rollout label -> anchor of its example; ``numbers``: rollout label -> its two-part verdict."""
    ranked = sorted(rollouts, key=lambda r: tuple(-x for x in severity(r)))
    rows = []
    for ref in ranked[:LIST_LIMIT]:
        check = ref.record.check
        findings = check.findings
        defect = sorted({f.cause for f in findings if not f.allowed})
        allowed = sorted({f.cause for f in findings if f.allowed} - set(defect))
        rows.append(
            RolloutRow(
                label=ref.label,
                step=ref.record.step,
                engine_failures=tuple(sorted({f.kind for f in check.engine_failures})),
                defect_causes=tuple(defect),
                allowed_causes=tuple(allowed),
                findings=len(findings),
                tokens=len(ref.record.input_ids),
                turns=check.num_turns,
                lost_sampled_tokens=check.lost_sampled_tokens,
                skipped=bool(check.template_view_skipped),
                example=examples.get(ref.label),
                gateway=gateway_branch(ref),
                numbers=(numbers or {}).get(ref.label),
            )
        )
    return rows, max(0, len(ranked) - LIST_LIMIT)


def filter_options(rows: Sequence[RolloutRow]) -> list[tuple[str, int]]:
    """(key, rollouts) for every filter key present, most common first."""
    counts: dict[str, int] = {}
    for row in rows:
        for key in row.filter_keys:
            counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
