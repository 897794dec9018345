"""Pick the worst rollouts (engine failures first, then defects, then most findings) and prepare each one; where
none of them holds an image and a rollout does, the first such rollout too (so its images are seen by their spans)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from verl_ext.check.numerics_verdict import TwoPartVerdict
from verl_ext.check.record import RecordedCheck, RecordedFailure, RecordedFinding
from verl_ext.report.load import RolloutRef
from verl_ext.report.loops import Loop, loop_of
from verl_ext.report.thumbnails import ThumbnailShelf, image_spans
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
    why: str = ""  # why a rollout that is not among the worst is shown (e.g. for its images)
    loop: Loop = Loop.UNKNOWN  # the loop that wrote it: its findings' fixes are that loop's
    numbers: TwoPartVerdict | None = None  # the two-part verdict, for a rollout shown because its numbers drift

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


def worst_examples(
    rollouts: Sequence[RolloutRef], decode: Decode, limit: int = 5, thumbnails: ThumbnailShelf | None = None
) -> list[Example]:
    """Only rollouts with something to show (a clean run yields none), and, when none of them holds an image, the
    first rollout that does (``limit`` > 0). ``thumbnails``: the page's thumbnails, shown beside each image."""
    ranked = sorted(
        (r for r in rollouts if any(severity(r))), key=lambda r: tuple(-x for x in severity(r))
    )  # sorted() is stable: ties keep file order
    chosen = [(ref, "") for ref in ranked[:limit]]
    if limit and not any(image_spans(ref.record) for ref, _ in chosen):
        pictured = next((ref for ref in rollouts if image_spans(ref.record)), None)
        if pictured is not None:
            chosen.append((pictured, "shown for its images"))
    return [
        Example(
            rank=k,
            label=ref.label,
            step=ref.record.step,
            check=ref.record.check,
            items=token_view(
                ref.record, decode, None if thumbnails is None else functools.partial(thumbnails.get, ref.file)
            ),
            tokens=len(ref.record.input_ids),
            defects=severity(ref)[1],
            why=why,
            loop=loop_of(ref.record),
        )
        for k, (ref, why) in enumerate(chosen, 1)
    ]
