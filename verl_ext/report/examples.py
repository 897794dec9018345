"""Pick the worst rollouts (engine failures first, then defects, then most findings) and prepare each one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from verl_ext.check.record import RecordedCheck, RecordedFailure, RecordedFinding
from verl_ext.report.load import RolloutRef
from verl_ext.report.tokens import Decode, Item, token_view


@dataclass(frozen=True)
class Example:
    """One ranked rollout shown token by token."""

    rank: int
    label: str
    step: int
    check: RecordedCheck
    items: list[Item]
    tokens: int
    defects: int

    @property
    def anchor(self) -> str:
        """The page anchor of this example."""
        return f"example-{self.rank}"

    @property
    def findings(self) -> tuple[RecordedFinding, ...]:
        """The check's findings on this rollout."""
        return self.check.findings

    @property
    def engine_failures(self) -> tuple[RecordedFailure, ...]:
        """The engine-view failures of this rollout."""
        return self.check.engine_failures


def severity(ref: RolloutRef) -> tuple[int, int, int]:
    """(engine failures, defects, findings): the order the report ranks rollouts by, worst first."""
    check = ref.record.check
    return len(check.engine_failures), check.defects, len(check.findings)


def worst_examples(rollouts: Sequence[RolloutRef], decode: Decode, limit: int = 5) -> list[Example]:
    """Only rollouts with something to show; a clean run yields none."""
    ranked = sorted(
        (r for r in rollouts if any(severity(r))), key=lambda r: tuple(-x for x in severity(r))
    )  # sorted() is stable: ties keep file order
    return [
        Example(
            rank=k,
            label=ref.label,
            step=ref.record.step,
            check=ref.record.check,
            items=token_view(ref.record, decode),
            tokens=len(ref.record.input_ids),
            defects=severity(ref)[1],
        )
        for k, ref in enumerate(ranked[:limit], 1)
    ]
