"""Matplotlib plots as inline SVG (no files, no URLs), one colour per cause shared with the HTML tables."""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import matplotlib

matplotlib.use("Agg")  # headless: the report is built on training hosts and in CI

import matplotlib.pyplot as plt  # noqa: E402
from markupsafe import Markup  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from verl_ext.check.findings import ALLOWED_BY_DESIGN, Cause  # noqa: E402
from verl_ext.report.summary import Summary  # noqa: E402

_BY_DESIGN = {c.value for c in ALLOWED_BY_DESIGN}

# Each cause's colour is written once, on the cause (``Cause.color``: defects warm, causes allowed by design cool, so
# the plot reads at a glance); a cause this version does not know (a newer record) is drawn in UNKNOWN_CAUSE_COLOR.
CAUSE_COLORS: dict[str, str] = {c.value: c.color for c in Cause}
UNKNOWN_CAUSE_COLOR = "#444444"


ALLOWED_BY_POLICY_COLOR = "#5e81ac"  # a defect cause the run's policy allowed: drawn cool, like the allowed ones


def cause_color(cause: str, defect: bool | None = None) -> str:
    """The cause's colour; a cause that is a defect by design but was allowed in these records (``defect`` False)
    is not drawn in its warm defect colour."""
    if defect is False and cause not in _BY_DESIGN:
        return ALLOWED_BY_POLICY_COLOR
    return CAUSE_COLORS.get(cause, UNKNOWN_CAUSE_COLOR)


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


NUMERICS_FLOOR = 1e-16  # a mean |Δ| of exactly 0 (bit-identical numbers) is drawn here on the log axis
NUMERICS_STEP_LINES = 10  # steps drawn as lines in the depth and turn panels (evenly picked, first and last kept)
THRESHOLD_COLOR = "#d62728"


def _picked_steps(steps: list[int]) -> list[int]:
    if len(steps) <= NUMERICS_STEP_LINES:
        return steps
    picks = {steps[round(k * (len(steps) - 1) / (NUMERICS_STEP_LINES - 1))] for k in range(NUMERICS_STEP_LINES)}
    return sorted(picks)


def _floored(values: list[float | None]) -> tuple[list[float], bool]:
    """Values for the log axis (None: not drawn, NaN) and whether a 0 was raised to the floor."""
    out, floored = [], False
    for v in values:
        if v is None:
            out.append(math.nan)
        elif v < NUMERICS_FLOOR:
            out.append(NUMERICS_FLOOR)
            floored = True
        else:
            out.append(v)
    return out, floored


class NumericsSeries(Protocol):
    """What the numerics plot draws (``report.numerics.NumericsSection`` is one): the plot knows no section."""

    @property
    def steps(self) -> Sequence[int]: ...
    @property
    def options(self) -> Any: ...  # its drift_mean_abs_delta is the dashed threshold
    @property
    def depth_labels(self) -> Sequence[str]: ...
    @property
    def depth_by_step(self) -> Mapping[int, Sequence[float | None]]: ...
    @property
    def turn_by_step(self) -> Mapping[int, Mapping[int, float]]: ...
    @property
    def overall_by_step(self) -> Mapping[int, float]: ...


def numerics_plot(section: NumericsSeries) -> Markup:
    """Three panels, mean |trainer − engine logprob| on a log axis with the drift threshold dashed: by depth bucket
    (a line per step), by turn (a line per step), and over the steps."""
    steps = list(section.steps)
    picked = _picked_steps(steps)
    thr = section.options.drift_mean_abs_delta
    cmap = plt.get_cmap("viridis")
    floored_any = False
    with plt.rc_context(_STYLE):
        fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(10, 8.2), gridspec_kw={"hspace": 0.55})
        for k, step in enumerate(picked):
            color = cmap(0.85 * k / max(1, len(picked) - 1))
            ys, f1 = _floored(list(section.depth_by_step[step]))
            top.plot(range(len(ys)), ys, marker="o", markersize=4, color=color, label=f"step {step}")
            turns = section.turn_by_step[step]
            ys, f2 = _floored([turns.get(t) for t in sorted(turns)])
            middle.plot(sorted(turns), ys, marker="o", markersize=4, color=color, label=f"step {step}")
            floored_any |= f1 or f2
        top.set_xticks(range(len(section.depth_labels)), section.depth_labels, rotation=20, fontsize=9)
        top.set_title("mean |Δ| by context depth (tokens, prompt included)", loc="left", fontsize=11)
        top.set_xlabel("depth bucket")
        middle.set_title("mean |Δ| by turn (engine call, from 0)", loc="left", fontsize=11)
        middle.set_xlabel("turn")
        middle.xaxis.get_major_locator().set_params(integer=True)
        ys, f3 = _floored([section.overall_by_step.get(s) for s in steps])
        floored_any |= f3
        bottom.plot(steps, ys, marker="s" if len(steps) <= 40 else None, color="#1f5fbf", label="all tokens")
        bottom.set_title("mean |Δ| per training step", loc="left", fontsize=11)
        bottom.set_xlabel("training step")
        if len(steps) <= 40:
            bottom.set_xticks(steps)
        for ax in (top, middle, bottom):
            ax.set_yscale("log")
            # plain tick text: the style turns mathtext off (record text must never be read as math)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0e}".replace("e-0", "e-")))
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
            ax.axhline(thr, color=THRESHOLD_COLOR, linestyle="--", linewidth=1.4, label=f"drift threshold {thr:g}")
            ax.set_ylabel("nats")
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)
        if floored_any:
            fig.text(0.01, 0.005, f"a mean |Δ| of 0 (identical numbers) is drawn at {NUMERICS_FLOOR:g}", fontsize=9)
        return _svg(fig)


class StalenessSeries(Protocol):
    """What the staleness plot draws (``report.versions.StalenessByStep`` is one): the plot knows no record."""

    @property
    def steps(self) -> Sequence[int]: ...
    def mean_lag(self, step: int) -> float: ...
    def max_lag(self, step: int) -> int: ...
    def mixed_share(self, step: int) -> float: ...
    def resumes_per_turn(self, step: int) -> float: ...


def staleness_plot(series: StalenessSeries) -> Markup:
    """Two panels over the trained steps: token-weighted mean and max staleness (versions behind the trained step),
    and the share of turns mixing versions with the resumes per turn."""
    steps = list(series.steps)
    marker = "s" if len(steps) <= 40 else None
    with plt.rc_context(_STYLE):
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 4.6), sharex=True, gridspec_kw={"hspace": 0.3})
        top.plot(steps, [series.mean_lag(s) for s in steps], marker=marker, color="#1f5fbf", label="mean (per token)")
        top.plot(steps, [series.max_lag(s) for s in steps], marker=marker, color="#c44e52", linestyle="--", label="max")
        top.set_title("staleness: versions between a token's policy and the trained step", loc="left", fontsize=11)
        top.set_ylabel("versions")
        top.set_ylim(bottom=0)
        bottom.plot(
            steps, [series.mixed_share(s) for s in steps], marker=marker, color="#55a868", label="turns mixing versions"
        )
        bottom.plot(
            steps,
            [series.resumes_per_turn(s) for s in steps],
            marker=marker,
            color="#8172b3",
            linestyle="--",
            label="resumes per turn",
        )
        bottom.set_title("turns across weight updates", loc="left", fontsize=11)
        bottom.set_ylim(bottom=0)
        bottom.set_xlabel("trained step")
        for ax in (top, bottom):
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)
        if 0 < len(steps) <= 40:
            bottom.set_xticks(steps)
        return _svg(fig)
