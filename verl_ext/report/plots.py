"""Matplotlib plots as inline SVG (no files, no URLs), one colour per cause shared with the HTML tables."""

from __future__ import annotations

import io
import re

import matplotlib

matplotlib.use("Agg")  # headless: the report is built on training hosts and in CI

import matplotlib.pyplot as plt  # noqa: E402
from markupsafe import Markup  # noqa: E402

from verl_ext.check.findings import ALLOWED_BY_DESIGN, Cause  # noqa: E402
from verl_ext.report.summary import Summary  # noqa: E402

_BY_DESIGN = {c.value for c in ALLOWED_BY_DESIGN}

# Defects in warm colours, causes allowed by design in cool ones, so the plot reads at a glance.
CAUSE_COLORS: dict[str, str] = {
    Cause.BPE_REMERGE: "#1f77b4",
    Cause.TOOL_CALL_RESERIALIZED: "#17becf",
    Cause.MALFORMED_TOOL_CALL: "#9edae5",
    Cause.REASONING_STRIPPED: "#2ca02c",
    Cause.REASONING_INSERTED: "#9467bd",
    Cause.EOS_ALIAS: "#7f7f7f",
    Cause.SYNTHETIC_CLOSE: "#006d77",
    Cause.CLOSE_VARIANT: "#5f9ea0",
    Cause.SPECIAL_TOKEN_ESCAPED: "#bcbd22",
    Cause.TOOL_RESULT_LABELLED: "#98df8a",
    Cause.CONTEXT_MOVED: "#c5b0d5",
    Cause.AMBIGUOUS_STOP_KEPT: "#aec7e8",
    Cause.BOUNDARY_MISSING: "#ff7f0e",
    Cause.CLOSE_MISSING: "#d62728",
    Cause.AMBIGUOUS_STOP_DUPLICATED: "#8c564b",
    Cause.SPECIAL_TOKEN_INJECTED: "#e377c2",
    Cause.STOP_TEXT_IN_MESSAGE: "#f4a261",
    Cause.UNKNOWN: "#7b0000",
}


ALLOWED_BY_POLICY_COLOR = "#5e81ac"  # a defect cause the run's policy allowed: drawn cool, like the allowed ones


def cause_color(cause: str, defect: bool | None = None) -> str:
    """The cause's colour; a cause that is a defect by design but was allowed in these records (``defect`` False)
    is not drawn in its warm defect colour."""
    if defect is False and cause not in _BY_DESIGN:
        return ALLOWED_BY_POLICY_COLOR
    return CAUSE_COLORS.get(cause, "#444444")


_STYLE = {
    "svg.fonttype": "none",  # real text in the SVG: smaller, sharp and searchable
    "svg.hashsalt": "verl-ext-report",  # stable element ids, so the same records give the same file
    "font.size": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "text.parse_math": False,  # cause names come from records: never read "$" as math
}


def _svg(fig: plt.Figure) -> Markup:
    buf = io.StringIO()
    # No date or creator metadata: the same records give the same bytes.
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    text = buf.getvalue()
    # Drop the XML prolog, DOCTYPE and RDF metadata: the SVG is inlined into HTML, and the page should hold no
    # URL but the SVG namespace ids. Matplotlib escapes the text it writes.
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text[text.index("<svg") :], flags=re.DOTALL)
    return Markup(text)


def _lines(ax: plt.Axes, steps: list[int], series: dict[str, list[int]], defect: bool) -> None:
    # Causes often share a count at a step; a small sideways dodge keeps every marker visible.
    spacing = min((b - a for a, b in zip(steps, steps[1:], strict=False)), default=1)
    dodge = 0.06 * spacing if len(steps) <= 40 else 0.0
    for k, (cause, counts) in enumerate(series.items()):
        shift = (k - (len(series) - 1) / 2) * dodge
        ax.plot(
            [s + shift for s in steps],
            counts,
            label=cause,
            color=cause_color(cause, defect),
            linestyle="-" if defect else "--",
            linewidth=2.4 if defect else 1.7,
            marker=("s" if defect else "o") if len(steps) <= 40 else None,
            markersize=6 if defect else 5,
        )
    ax.set_ylim(bottom=0, top=max((max(c) for c in series.values()), default=0) * 1.15 + 0.5)
    ax.yaxis.get_major_locator().set_params(integer=True)
    if series:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=10)
    else:
        note = "none: no defect at any step" if defect else "none"
        ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes, color="#1e8e3e" if defect else "#666")


def findings_over_steps(summary: Summary, allowed: set[str]) -> Markup:
    """Three panels over the steps: defect findings per cause (should stay empty), findings of ``allowed`` causes
    (by design or by the run's policy), and the share of rollouts with a defect or an engine failure."""
    steps = list(summary.steps)
    defects = {c: n for c, n in summary.findings_by_step.items() if c not in allowed}
    allowed = {c: n for c, n in summary.findings_by_step.items() if c in allowed}
    with plt.rc_context(_STYLE):
        fig, (top, middle, bottom) = plt.subplots(
            3, 1, figsize=(10, 6.2), sharex=True, gridspec_kw={"height_ratios": [2, 2, 1.1], "hspace": 0.28}
        )
        _lines(top, steps, defects, defect=True)
        top.set_title("defects per cause (must stay at 0)", loc="left", fontsize=11, color="#d62728")
        top.set_ylabel("findings")
        _lines(middle, steps, allowed, defect=False)
        middle.set_title("allowed (by design or policy), per cause", loc="left", fontsize=11, color="#6d3fd1")
        middle.set_ylabel("findings")
        rate = [100 * r for r in summary.defect_rate_by_step]
        bars = bottom.bar(steps, rate, color=["#d62728" if r else "#2ca02c" for r in rate], width=0.6)
        if len(steps) <= 40:
            bottom.bar_label(bars, labels=[f"{r:.0f}%" for r in rate], fontsize=9, padding=2)
        bottom.set_ylim(0, 118)
        bottom.set_title("rollouts with a defect or engine failure", loc="left", fontsize=11)
        bottom.set_ylabel("%")
        bottom.set_xlabel("training step")
        if len(steps) <= 40:
            bottom.set_xticks(steps)
        return _svg(fig)
