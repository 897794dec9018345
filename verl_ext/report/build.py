"""Records in, one self-contained HTML file out: load, aggregate, pick examples, plot, render."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_ext.check.findings import FailureKind
from verl_ext.core.errors import MissingFileError
from verl_ext.report.audit import audit_view
from verl_ext.report.examples import worst_examples
from verl_ext.report.fixes import NUMERICS_FIX, SKIPPED_FIX, TRUNCATION_FIX, cause_fix, engine_fix
from verl_ext.report.forks import forked_sessions
from verl_ext.report.html import render
from verl_ext.report.listing import filter_options, rollout_rows
from verl_ext.report.load import Records, RolloutRef, load_records, revalidated_records
from verl_ext.report.loops import Loop, loop_of
from verl_ext.report.numerics import drift_examples, numerics_section, rollout_numbers, run_absent
from verl_ext.report.plots import findings_over_steps
from verl_ext.report.summary import Summary, summarize
from verl_ext.report.thumbnails import ThumbnailCounts, ThumbnailShelf, thumbnail_counts
from verl_ext.report.tokens import Decode
from verl_ext.report.verdict import verdict, with_numerics
from verl_ext.report.versions import versions_section


@dataclass(frozen=True)
class Report:
    """The page, its summary and the warnings met while building it."""

    html: str
    summary: Summary
    warnings: tuple[str, ...]
    images: ThumbnailCounts | None = None  # the records' images and their thumbnails (None: no image)


def decoding_mismatches(records: Records, decode: Decode, limit: int = 50) -> int:
    """Findings whose stream text the given tokenizer decodes differently: the wrong tokenizer was passed."""
    bad = 0
    seen = 0
    for ref in records.rollouts:
        for f in ref.record.check.findings:
            if f.stream_ids and seen < limit:
                seen += 1
                bad += decode(f.stream_ids) != f.stream_text
    return bad


def chosen_fix(name: str, fix: Callable[[str, Loop], str], loops: Iterable[Loop]) -> str:
    """The fix of cause or kind ``name`` for records ``loops`` wrote: one line where they agree, else each loop's
    line said for its records (a page of records from verl's stock loop and from verl_ext's)."""
    texts: dict[str, list[Loop]] = {}
    for loop in sorted(set(loops)) or [Loop.UNKNOWN]:
        texts.setdefault(fix(name, loop), []).append(loop)
    if len(texts) == 1:
        return next(iter(texts))
    said = []
    for text, by in texts.items():
        whose = ", ".join("other loops'" if loop is Loop.UNKNOWN else f"{loop.value}'s" for loop in by)
        said.append(f"On {whose} records: {text}")
    return " ".join(said)


def chosen_fixes(
    rollouts: Sequence[RolloutRef], causes: Iterable[str], kinds: Iterable[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Each cause's and engine-failure kind's fix, chosen by the loops that wrote the rollouts it occurs in (every
    rollout's loop for one that does not occur)."""
    every: set[Loop] = set()
    by_cause: dict[str, set[Loop]] = defaultdict(set)
    by_kind: dict[str, set[Loop]] = defaultdict(set)
    for ref in rollouts:
        loop = loop_of(ref.record)
        every.add(loop)
        for f in ref.record.check.findings:
            by_cause[f.cause].add(loop)
        for e in ref.record.check.engine_failures:
            by_kind[e.kind].add(loop)
    return (
        {c: chosen_fix(c, cause_fix, by_cause.get(c) or every) for c in causes},
        {k: chosen_fix(k, engine_fix, by_kind.get(k) or every) for k in kinds},
    )


def build_report(
    records: Records | Sequence[str | os.PathLike[str]],
    decode: Decode,
    examples: int = 5,
    vocab_size: int | None = None,
) -> Report:
    """``records``: loaded (``load_records``) or record file paths. Every rollout's stored engine calls are
    re-validated (``revalidated_records``; ``vocab_size``: the decoding tokenizer's, None to skip the id range)."""
    if not isinstance(records, Records):
        records = load_records(records)
    records = revalidated_records(records, vocab_size)
    summary = summarize(records.rollouts)
    warnings = []
    if decoding_mismatches(records, decode):
        warnings.append(
            "the tokenizer decodes some finding tokens differently from the check that wrote these records; "
            "token texts below may be wrong (pass the tokenizer the rollouts used with --tokenizer)"
        )
    if not records.profiles:
        warnings.append("the record files have no header line, so the template audit is missing")
    shelf = ThumbnailShelf()
    shown = worst_examples(records.rollouts, decode, examples, shelf)
    numbers = rollout_numbers(records.rollouts, records.numerics)
    if not run_absent(records.rollouts, records.numerics):
        shown += drift_examples(
            records.rollouts, records.numerics, numbers, decode, len(shown) + 1, {ex.label for ex in shown}, shelf
        )
    anchors = {ex.label: ex.anchor for ex in shown}
    numerics = numerics_section(records.rollouts, records.numerics, numbers, anchors)
    rows, rows_left_out = rollout_rows(records.rollouts, anchors, None if numerics.absent else numbers)
    sessions, sessions_left_out = forked_sessions(records.rollouts, anchors)
    images = thumbnail_counts(records.rollouts)
    kinds = [k.value for k in FailureKind] + sorted(set(summary.engine_failure_kinds) - {k.value for k in FailureKind})
    cause_fixes, engine_fixes = chosen_fixes(records.rollouts, [r.cause for r in summary.causes], kinds)
    html = render(
        "report.html.j2",
        files=records.files,
        summary=summary,
        verdict=with_numerics(verdict(summary, cause_fixes, engine_fixes), numerics),
        numerics=numerics,
        plot=findings_over_steps(summary, {r.cause for r in summary.causes if not r.is_defect}),
        examples=shown,
        rows=rows,
        rows_left_out=rows_left_out,
        filters=filter_options(rows),
        sessions=sessions,
        sessions_left_out=sessions_left_out,
        session_of={row.label: f"session-{k}" for k, forked in enumerate(sessions, 1) for row in forked.branches},
        cause_fixes=cause_fixes,
        engine_fixes=engine_fixes,
        cause_fix=cause_fix,  # an example's findings get its own loop's fix
        engine_fix=engine_fix,
        truncation_fix=TRUNCATION_FIX,
        skipped_fix=SKIPPED_FIX,
        numerics_fix=NUMERICS_FIX,
        audits=[audit_view(p, decode) for p in records.profiles],
        warnings=warnings,
        images=images,
        versions=versions_section(records.rollouts),
    )
    return Report(html, summary, tuple(warnings), images)


def write_html(path: str | os.PathLike[str], html: str) -> Path:
    """Write the page to ``path``; the folder must exist (an error names it otherwise)."""
    out = Path(path)
    if not out.parent.is_dir():
        raise MissingFileError(f"cannot write {str(out)!r}: folder {str(out.parent)!r} does not exist; create it first")
    out.write_text(html, encoding="utf-8")
    return out
