"""Pick the worst rollouts (engine failures first, then defects, then most findings) and prepare each one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.report.load import RolloutRef
from verl_ext.report.summary import check_of, step_of
from verl_ext.report.tokens import Decode, Item, token_view


@dataclass(frozen=True)
class Example:
    rank: int
    label: str
    step: int
    check: dict[str, Any]
    items: list[Item]
    tokens: int
    defects: int

    @property
    def anchor(self) -> str:
        return f"example-{self.rank}"

    @property
    def findings(self) -> list[dict[str, Any]]:
        return list(self.check.get("findings") or [])

    @property
    def engine_failures(self) -> list[dict[str, Any]]:
        return list(self.check.get("engine_failures") or [])


def severity(ref: RolloutRef) -> tuple[int, int, int]:
    check = check_of(ref)
    findings = check.get("findings") or []
    defects = sum(not f.get("allowed", False) for f in findings)
    return len(check.get("engine_failures") or []), defects, len(findings)


def worst_examples(rollouts: Sequence[RolloutRef], decode: Decode, limit: int = 5) -> list[Example]:
    """Only rollouts with something to show; a clean run yields none."""
    ranked = sorted(
        (r for r in rollouts if any(severity(r))), key=lambda r: tuple(-x for x in severity(r))
    )  # sorted() is stable: ties keep file order
    return [
        Example(
            rank=k,
            label=ref.label,
            step=step_of(ref),
            check=check_of(ref),
            items=token_view(ref.record, decode),
            tokens=len(ref.record.get("input_ids") or []),
            defects=severity(ref)[1],
        )
        for k, ref in enumerate(ranked[:limit], 1)
    ]
