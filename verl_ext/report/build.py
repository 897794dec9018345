"""Records in, one self-contained HTML file out: load, aggregate, pick examples, plot, render."""

from __future__ import annotations

import os
from collections.abc import Sequence
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
from verl_ext.report.load import Records, load_records, revalidated_records
from verl_ext.report.numerics import drift_examples, numerics_section, rollout_numbers, run_absent
from verl_ext.report.plots import findings_over_steps
from verl_ext.report.summary import Summary, summarize
from verl_ext.report.thumbnails import ThumbnailCounts, ThumbnailShelf, thumbnail_counts
from verl_ext.report.tokens import Decode
from verl_ext.report.verdict import verdict, with_numerics


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
    html = render(
        "report.html.j2",
        files=records.files,
        summary=summary,
        verdict=with_numerics(verdict(summary), numerics),
        numerics=numerics,
        plot=findings_over_steps(summary, {r.cause for r in summary.causes if not r.is_defect}),
        examples=shown,
        rows=rows,
        rows_left_out=rows_left_out,
        filters=filter_options(rows),
        sessions=sessions,
        sessions_left_out=sessions_left_out,
        session_of={row.label: f"session-{k}" for k, forked in enumerate(sessions, 1) for row in forked.branches},
        cause_fixes={r.cause: cause_fix(r.cause) for r in summary.causes},
        engine_fixes={k: engine_fix(k) for k in kinds},
        truncation_fix=TRUNCATION_FIX,
        skipped_fix=SKIPPED_FIX,
        numerics_fix=NUMERICS_FIX,
        audits=[audit_view(p, decode) for p in records.profiles],
        warnings=warnings,
        images=images,
    )
    return Report(html, summary, tuple(warnings), images)


def write_html(path: str | os.PathLike[str], html: str) -> Path:
    """Write the page to ``path``; the folder must exist (an error names it otherwise)."""
    out = Path(path)
    if not out.parent.is_dir():
        raise MissingFileError(f"cannot write {str(out)!r}: folder {str(out.parent)!r} does not exist; create it first")
    out.write_text(html, encoding="utf-8")
    return out
