"""Matplotlib plots as inline SVG (no files, no URLs), one colour per cause shared with the HTML tables."""

from __future__ import annotations

import io
import re

import matplotlib

matplotlib.use("Agg")  # headless: the report is built on training hosts and in CI

import matplotlib.pyplot as plt  # noqa: E402
from markupsafe import Markup  # noqa: E402

from verl_ext.check.findings import Cause  # noqa: E402
from verl_ext.report.summary import Summary  # noqa: E402

# Defects in warm colours, causes allowed by design in cool ones, so the plot reads at a glance.
CAUSE_COLORS: dict[str, str] = {
    Cause.BPE_REMERGE: "#1f77b4",
    Cause.TOOL_CALL_RESERIALIZED: "#17becf",
    Cause.REASONING_STRIPPED: "#2ca02c",
    Cause.REASONING_INSERTED: "#9467bd",
    Cause.EOS_ALIAS: "#7f7f7f",
    Cause.SYNTHETIC_CLOSE: "#006d77",
    Cause.SPECIAL_TOKEN_ESCAPED: "#bcbd22",
    Cause.AMBIGUOUS_STOP_KEPT: "#aec7e8",
    Cause.BOUNDARY_MISSING: "#ff7f0e",
    Cause.CLOSE_MISSING: "#d62728",
    Cause.AMBIGUOUS_STOP_DUPLICATED: "#8c564b",
    Cause.SPECIAL_TOKEN_INJECTED: "#e377c2",
    Cause.UNKNOWN: "#7b0000",
}


def cause_color(cause: str) -> str:
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


def findings_over_steps(summary: Summary, allowed_by_design: set[str]) -> Markup:
    steps = list(summary.steps)
    with plt.rc_context(_STYLE):
        fig, (top, bottom) = plt.subplots(
            2, 1, figsize=(10, 4.6), sharex=True, gridspec_kw={"height_ratios": [3, 1.2], "hspace": 0.12}
        )
        if not summary.findings_by_step:
            top.text(0.5, 0.5, "no findings", ha="center", va="center", transform=top.transAxes, color="#666")
        for cause, counts in summary.findings_by_step.items():
            allowed = cause in allowed_by_design
            top.plot(
                steps,
                counts,
                label=f"{cause}{'' if allowed else '  (defect)'}",
                color=cause_color(cause),
                linestyle="--" if allowed else "-",
                linewidth=1.6 if allowed else 2.6,
                marker="o" if allowed else "s",
                markersize=5 if allowed else 6,
            )
        top.set_ylabel("findings")
        top.set_ylim(bottom=0)
        top.yaxis.get_major_locator().set_params(integer=True)
        if summary.findings_by_step:
            top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=10)
        rate = [100 * r for r in summary.defect_rate_by_step]
        bars = bottom.bar(steps, rate, color=["#d62728" if r else "#2ca02c" for r in rate], width=0.6)
        bottom.bar_label(bars, labels=[f"{r:.0f}%" for r in rate], fontsize=9, padding=2)
        bottom.set_ylim(0, 118)
        bottom.set_ylabel("defect\nrollouts %")
        bottom.set_xlabel("training step")
        bottom.set_xticks(steps)
        return _svg(fig)
