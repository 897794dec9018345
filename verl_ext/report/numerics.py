"""The report's numerics section: the trainer's logprobs beside the engine's, by depth and by turn, per step; the
rollouts that drift most (with the turn and position where it starts, and their token view); each rollout's
two-part verdict for the list. Records without numbers (schema 5 and older, or files without the driver's
numerics lines) give a section that says the view is absent and why."""

from __future__ import annotations

import dataclasses
import functools
from bisect import bisect_right
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from markupsafe import Markup

from verl_ext.check.numerics_record import NUMERICS_SINCE, NumericsIndex, NumericsRecord
from verl_ext.check.numerics_verdict import TwoPartVerdict, record_verdict
from verl_ext.check.record import RolloutRecord
from verl_ext.core.numerics import DeltaStats, NumericsOptions, RolloutNumerics, depth_bucket_label
from verl_ext.report.examples import Example
from verl_ext.report.load import RolloutRef
from verl_ext.report.plots import numerics_plot
from verl_ext.report.thumbnails import ThumbnailShelf
from verl_ext.report.tokens import Decode, Marker, token_view

DRIFT_EXAMPLES = 3  # drifting rollouts shown token by token
DRIFT_ROWS = 20  # rows of the table of rollouts that drift most


@dataclass(frozen=True)
class DriftRow:
    """One rollout of the table of those whose numbers drift most."""

    label: str
    step: int
    verdict: TwoPartVerdict
    worst_mean_abs: float
    max_abs: float
    tokens: int
    example: str | None  # anchor of its token view


@dataclass(frozen=True)
class NumericsSection:
    """What the page's numerics section shows; ``absent`` (non-empty) replaces it all with the reason."""

    absent: str = ""
    measured: int = 0  # rollouts with the trainer's numbers
    unmeasured: dict[str, int] = field(default_factory=dict)  # why the others have none -> rollouts
    drift_rollouts: int = 0
    not_compared: int = 0  # rollouts whose tokens are not the engine's: numbers not compared
    options: NumericsOptions = field(default_factory=NumericsOptions)
    steps: tuple[int, ...] = ()
    depth_labels: tuple[str, ...] = ()
    depth_by_step: dict[int, list[float | None]] = field(default_factory=dict)  # step -> mean |Δ| per bucket
    turn_by_step: dict[int, dict[int, float]] = field(default_factory=dict)  # step -> turn -> mean |Δ|
    overall_by_step: dict[int, float] = field(default_factory=dict)
    worst: tuple[DriftRow, ...] = ()
    plot: Markup | None = None
    sources: tuple[str, ...] = ()


def rollout_numbers(rollouts: Sequence[RolloutRef], index: NumericsIndex) -> dict[str, TwoPartVerdict]:
    """Each rollout's two-part verdict, by its label."""
    return {
        ref.label: record_verdict(ref.record.check, index.view(ref.record.rollout_id, ref.record.version))
        for ref in rollouts
    }


def _trainer_numbers(ref: RolloutRef, index: NumericsIndex) -> NumericsRecord | None:
    return index.view(ref.record.rollout_id, ref.record.version).trainer


def run_absent(rollouts: Sequence[RolloutRef], index: NumericsIndex) -> str:
    """Why no rollout of the run has numbers ("" when some has)."""
    if any(_trainer_numbers(ref, index) for ref in rollouts):
        return ""
    versions = sorted({ref.record.version for ref in rollouts})
    if versions[-1] < NUMERICS_SINCE:
        shown = ", ".join(map(str, versions))
        return (
            f"These records are of schema version {shown}, written before verl_ext had the numerics view (schema "
            f"version {NUMERICS_SINCE}): they hold the tokens, not the trainer's numbers. Train with this verl_ext "
            "to record them."
        )
    if not index.lines:
        return (
            "These files hold no numerics lines: the trainer's driver writes them to its own file in "
            "verl_ext.records.dir, so pass every file of that folder (verl-ext report DIR/*.jsonl). A run whose "
            "trainer did not compute its logprobs records none."
        )
    return (
        f"The files hold {index.lines} numerics lines, but none of the trainer's for these rollouts' ids (re-feed "
        "audit lines only, or lines from another run): pass the record files of one run."
    )


def _mean(s: DeltaStats) -> float | None:
    return s.mean_abs if s.count else None


def numerics_section(
    rollouts: Sequence[RolloutRef],
    index: NumericsIndex,
    verdicts: Mapping[str, TwoPartVerdict],
    anchors: Mapping[str, str],
) -> NumericsSection:
    """The section from the records and their joined numerics (``verdicts``: ``rollout_numbers``; ``anchors``:
    rollout label -> its token view's anchor)."""
    absent = run_absent(rollouts, index)
    if absent:
        return NumericsSection(absent=absent)
    measured: list[tuple[RolloutRef, NumericsRecord]] = []
    unmeasured: Counter[str] = Counter()
    for ref in rollouts:
        numbers = _trainer_numbers(ref, index)
        if numbers is None:
            unmeasured[verdicts[ref.label].numbers_detail] += 1
        else:
            measured.append((ref, numbers))
    # The run's options: the thresholds most lines were written with (each rollout's verdict uses its own line's).
    options = Counter(n.options for _, n in measured).most_common(1)[0][0]
    edges = options.depth_edges
    depth: dict[int, list[DeltaStats]] = {}
    turns: dict[int, dict[int, DeltaStats]] = {}
    overall: dict[int, DeltaStats] = {}
    for ref, n in measured:
        if ref.record.check.engine_ok and n.numerics.depth_edges == edges:  # numbers of other tokens: not drawn
            step = ref.record.step
            row = depth.setdefault(step, [DeltaStats() for _ in edges])
            for b, s in n.numerics.by_depth.items():
                row[b] = row[b].merge(s)
            by_turn = turns.setdefault(step, {})
            for t, s in n.numerics.by_turn.items():
                by_turn[t] = by_turn[t].merge(s) if t in by_turn else s
            overall[step] = overall.get(step, DeltaStats()).merge(n.numerics.overall)
    steps = tuple(sorted(depth))
    rows = sorted(
        (
            DriftRow(
                ref.label,
                ref.record.step,
                verdicts[ref.label],
                n.numerics.verdict(n.options).worst_mean_abs,
                n.numerics.overall.max_abs,
                n.numerics.overall.tokens,
                anchors.get(ref.label),
            )
            for ref, n in measured
            if verdicts[ref.label].numbers == "drift"
        ),
        key=lambda r: -r.worst_mean_abs,
    )
    section = NumericsSection(
        measured=len(measured),
        unmeasured=dict(unmeasured),
        drift_rollouts=len(rows),
        not_compared=sum(v.numbers == "not compared" for v in verdicts.values()),
        options=options,
        steps=steps,
        depth_labels=tuple(depth_bucket_label(edges, b) for b in range(len(edges))),
        depth_by_step={s: [_mean(x) for x in depth[s]] for s in steps},
        turn_by_step={s: {t: x.mean_abs for t, x in sorted(turns[s].items()) if x.count} for s in steps},
        overall_by_step={s: overall[s].mean_abs for s in steps if overall[s].count},
        worst=tuple(rows[:DRIFT_ROWS]),
        sources=tuple(sorted({n.numerics.source for _, n in measured})),
    )
    return dataclasses.replace(section, plot=numerics_plot(section)) if steps else section


def drift_positions(record: RolloutRecord, numerics: RolloutNumerics, options: NumericsOptions) -> set[int]:
    """Stream positions of the trained tokens where the numbers drift, as far as summaries tell: in a turn and a
    depth bucket that both drift (a bucket drifts with a drifting turn in it, so either alone would colour clean
    tokens beside the drift), or in the drifting turns or buckets where only one kind drifts."""
    thr = options.drift_mean_abs_delta
    turns = {t for t, s in numerics.by_turn.items() if s.nonfinite or (s.count and s.mean_abs > thr)}
    buckets = {b for b, s in numerics.by_depth.items() if s.nonfinite or (s.count and s.mean_abs > thr)}
    mask, turn_of, edges = record.loss_mask, record.turn_of, numerics.depth_edges
    out = set()
    for p in range(record.prompt_length, min(len(record.input_ids), len(mask), len(turn_of))):
        if mask[p]:
            in_turn, in_bucket = turn_of[p] in turns, bisect_right(edges, p) - 1 in buckets
            if (in_turn and in_bucket) or (in_turn and not buckets) or (in_bucket and not turns):
                out.add(p)
    return out


def drift_examples(
    rollouts: Sequence[RolloutRef],
    index: NumericsIndex,
    verdicts: Mapping[str, TwoPartVerdict],
    decode: Decode,
    first_rank: int,
    shown: set[str],
    thumbnails: ThumbnailShelf | None = None,
    limit: int = DRIFT_EXAMPLES,
) -> list[Example]:
    """The rollouts whose numbers drift most (not already among ``shown``), token by token, the drifting tokens
    coloured and a mark where the drift starts."""
    ranked = sorted(
        (
            (ref, n)
            for ref in rollouts
            if verdicts[ref.label].numbers == "drift" and ref.label not in shown
            for n in [_trainer_numbers(ref, index)]
            if n is not None
        ),
        key=lambda rn: -rn[1].numerics.verdict(rn[1].options).worst_mean_abs,
    )
    out = []
    for k, (ref, n) in enumerate(ranked[:limit], first_rank):
        v = verdicts[ref.label]
        at = v.numerics.position if v.numerics else None
        title = f"the numbers drift from here: {v.numbers_detail}"
        marker = Marker("D", "numbers drift", False, None, title, drift=True)
        items = token_view(
            ref.record,
            decode,
            None if thumbnails is None else functools.partial(thumbnails.get, ref.file),
            drift=drift_positions(ref.record, n.numerics, n.options),
            drift_start=marker if at is not None else None,
            drift_at=at,
        )
        out.append(
            Example(
                rank=k,
                label=ref.label,
                step=ref.record.step,
                check=ref.record.check,
                items=items,
                tokens=len(ref.record.input_ids),
                defects=ref.record.check.defects,
                why=f"numbers drift: {v.numbers_detail}",
                numbers=v,
            )
        )
    return out
