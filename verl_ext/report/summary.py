"""Aggregate the ``check`` object of every rollout record: the summary table, findings per step and per turn.

Works on the records' ``RecordedCheck`` (causes are strings there), so the report needs no checker objects and
counts a cause a newer verl_ext wrote under its own name.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from verl_ext.check.findings import ALLOWED_BY_DESIGN, Cause
from verl_ext.report.forks import ForkCounts, fork_counts
from verl_ext.report.load import RolloutRef
from verl_ext.report.loops import Loop, loop_of


@dataclass(frozen=True)
class CauseRow:
    """One cause's counts over the records."""

    cause: str
    allowed_by_design: bool
    allowed: int  # findings the policy allowed
    defects: int  # findings counted as defects
    rollouts: int  # rollouts with at least one finding of this cause

    @property
    def total(self) -> int:
        """Findings of this cause, allowed or not."""
        return self.allowed + self.defects

    @property
    def is_defect(self) -> bool:
        """Drawn as a defect: some finding of it was one in these records (a cause the policy allowed is not)."""
        return self.defects > 0 or (self.total == 0 and not self.allowed_by_design)


@dataclass(frozen=True)
class Summary:
    """The counts the page's summary, plots and verdict are drawn from."""

    rollouts: int
    steps: tuple[int, ...]
    engine_failures: int
    engine_failed_rollouts: int
    defect_rollouts: int  # rollouts with an engine failure or a defect (the check's ``ok`` is false)
    causes: tuple[CauseRow, ...]  # every known cause, then any unknown to this version
    repairs: dict[str, int]
    truncated: int
    lost_sampled_tokens: int
    sampled_tokens: int
    template_view_rollouts: int
    check_seconds_mean: float
    check_seconds_max: float
    findings_by_step: dict[str, list[int]] = field(default_factory=dict)  # cause -> count per step in ``steps``
    defect_rate_by_step: list[float] = field(default_factory=list)
    findings_by_turn: dict[int, dict[str, int]] = field(default_factory=dict)  # turn -> cause -> count
    template_view_skipped: int = 0  # rollouts whose template view ran out of its time budget
    engine_failure_kinds: dict[str, int] = field(default_factory=dict)  # kind -> failures
    truncated_rollouts_lost: int = 0  # rollouts that lost at least one sampled token to truncation
    gateway: ForkCounts | None = None  # the gateway's sessions, branches and forks (None: no gateway rollout)
    loops: dict[str, int] = field(default_factory=dict)  # the loop that wrote them (``Loop``) -> rollouts

    @property
    def has_steps(self) -> bool:
        """Some rollout came from a training run: the standalone gateway's records have sessions, not steps (their
        step is 0 because nothing trained), so a page of only those draws no step card, plot or filter."""
        return set(self.loops) != {Loop.GATEWAY.value}

    @property
    def lost_share(self) -> float:
        """Share of the engine's sampled tokens cut by the response length (never trained)."""
        return self.lost_sampled_tokens / self.sampled_tokens if self.sampled_tokens else 0.0

    @property
    def defect_rate(self) -> float:
        """Share of rollouts with an engine failure or a defect (0 when there are none)."""
        return self.defect_rollouts / self.rollouts if self.rollouts else 0.0

    @property
    def findings(self) -> int:
        """Findings of every cause."""
        return sum(row.total for row in self.causes)

    @property
    def defects(self) -> int:
        """Findings counted as defects."""
        return sum(row.defects for row in self.causes)

    @property
    def turn_peak(self) -> int:
        """The largest cell of the per-turn table (its shading scale)."""
        return max((n for counts in self.findings_by_turn.values() for n in counts.values()), default=1)

    def one_line(self) -> str:
        """The summary as ``verl-ext report`` prints it (with the gateway's forks where it wrote rollouts)."""
        if not self.has_steps:
            steps = f"from {Loop.GATEWAY.value}"
        elif len(self.steps) == 1:
            steps = f"at step {self.steps[0]}"
        else:
            steps = f"over {len(self.steps)} steps"
        line = (
            f"{_count(self.rollouts, 'rollout')} {steps}, {_count(self.engine_failures, 'engine-view failure')}, "
            f"{self.defect_rollouts} rollouts with defects ({self.defect_rate:.1%}), {self.findings} findings"
        )
        if self.gateway is not None:
            g = self.gateway
            line += f", {g.forks} forks in {g.forked_sessions} of {g.sessions} gateway sessions"
        return line


def _count(n: int, noun: str) -> str:
    """``1 rollout``, ``2 rollouts``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def summarize(rollouts: Sequence[RolloutRef]) -> Summary:
    """The summary of these rollouts (counts per cause, step and turn)."""
    checks = [r.record.check for r in rollouts]
    steps = sorted({r.record.step for r in rollouts})
    step_index = {s: i for i, s in enumerate(steps)}

    allowed: Counter[str] = Counter()
    defects: Counter[str] = Counter()
    with_cause: Counter[str] = Counter()
    repairs: Counter[str] = Counter()
    by_step: dict[str, list[int]] = defaultdict(lambda: [0] * len(steps))
    bad_by_step = [0] * len(steps)
    all_by_step = [0] * len(steps)
    by_turn: dict[int, Counter[str]] = defaultdict(Counter)
    for ref, check in zip(rollouts, checks, strict=True):
        i = step_index[ref.record.step]
        all_by_step[i] += 1
        bad_by_step[i] += not check.ok
        for f in check.findings:
            (allowed if f.allowed else defects)[f.cause] += 1
            by_step[f.cause][i] += 1
            by_turn[f.turn][f.cause] += 1
        with_cause.update({f.cause for f in check.findings})
        repairs.update(check.repairs)

    known = [c.value for c in Cause]
    names = known + sorted((set(allowed) | set(defects)) - set(known))
    rows = tuple(
        CauseRow(c, c in {a.value for a in ALLOWED_BY_DESIGN}, allowed[c], defects[c], with_cause[c]) for c in names
    )
    seconds = [c.seconds for c in checks]
    gateway = fork_counts(rollouts)
    return Summary(
        rollouts=len(rollouts),
        steps=tuple(steps),
        engine_failures=sum(len(c.engine_failures) for c in checks),
        engine_failed_rollouts=sum(not c.engine_ok for c in checks),
        defect_rollouts=sum(not c.ok for c in checks),
        causes=rows,
        repairs=dict(sorted(repairs.items())),
        truncated=sum(c.truncated for c in checks),
        lost_sampled_tokens=sum(c.lost_sampled_tokens for c in checks),
        sampled_tokens=sum(c.num_sampled for c in checks),
        template_view_rollouts=sum(c.template_view for c in checks),
        check_seconds_mean=sum(seconds) / len(seconds) if seconds else 0.0,
        check_seconds_max=max(seconds, default=0.0),
        findings_by_step={c: by_step[c] for c in names if c in by_step},
        defect_rate_by_step=[b / n if n else 0.0 for b, n in zip(bad_by_step, all_by_step, strict=True)],
        findings_by_turn={t: dict(by_turn[t]) for t in sorted(by_turn)},
        template_view_skipped=sum(bool(c.template_view_skipped) for c in checks),
        engine_failure_kinds=dict(Counter(f.kind for c in checks for f in c.engine_failures).most_common()),
        truncated_rollouts_lost=sum(c.lost_sampled_tokens > 0 for c in checks),
        gateway=gateway if gateway.branches else None,
        loops=dict(Counter(loop_of(r.record).value for r in rollouts).most_common()),
    )
