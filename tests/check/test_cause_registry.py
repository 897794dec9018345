"""One record per cause: its kind, meaning, fix and colour live on the ``Cause`` member, and the check
(``ALLOWED_BY_DESIGN``), the report (fixes, plot and table colours) and docs (tests/test_docs_hygiene.py) read them.
Before, a cause was named in six places and six of 23 were drawn grey in the report's plots."""

from __future__ import annotations

from verl_ext.check import ALLOWED_BY_DESIGN, CheckPolicy
from verl_ext.check.findings import Cause, CauseKind
from verl_ext.report.fixes import CAUSE_FIXES, cause_fix
from verl_ext.report.plots import ALLOWED_BY_POLICY_COLOR, CAUSE_COLORS, UNKNOWN_CAUSE_COLOR, cause_color


def test_each_cause_has_its_kind_meaning_fix_and_colour():
    for cause in Cause:
        assert cause.kind in (CauseKind.ALLOWED, CauseKind.DEFECT), cause
        for text in (cause.meaning, cause.fix):
            assert text.strip() and "\n" not in text, (cause, text)
        assert cause.color.startswith("#") and len(cause.color) == 7, (cause, cause.color)


def test_the_check_reads_the_kind():
    assert {c for c in Cause if c.kind is CauseKind.ALLOWED} == ALLOWED_BY_DESIGN
    assert CheckPolicy().allowed_causes == ALLOWED_BY_DESIGN
    assert Cause.MESSAGE_DIFFERS not in ALLOWED_BY_DESIGN and Cause.PREFILL_DROPPED in ALLOWED_BY_DESIGN


def test_the_report_draws_every_cause_in_a_colour_of_its_own():
    """No cause falls back to the grey of a cause this version does not know (message_differs, prefill_dropped,
    content_whitespace, reasoning_reformatted, sampled_text_kept and template_refused did), and no two share one."""
    colours = {c: cause_color(c.value, c.kind is CauseKind.DEFECT) for c in Cause}
    assert colours == {c: c.color for c in Cause}
    assert len(set(colours.values())) == len(Cause)
    assert not {UNKNOWN_CAUSE_COLOR, ALLOWED_BY_POLICY_COLOR} & set(colours.values())
    assert {c.value: c.color for c in Cause} == CAUSE_COLORS
    assert cause_color("a_cause_of_a_newer_version") == UNKNOWN_CAUSE_COLOR


def test_the_report_reads_each_fix_from_its_cause():
    assert {c.value: c.fix for c in Cause} == CAUSE_FIXES
    assert all(cause_fix(c.value) == c.fix for c in Cause)
