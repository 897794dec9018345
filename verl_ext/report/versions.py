"""The report's policy-version views: per rollout a version strip over its output tokens (which version generated
what, where the aborts were), per run the token-weighted staleness over the steps (``plots.staleness_plot``).

Both read the records' ``versions`` (schema 7); records without them are counted, never drawn as version 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup, escape

from verl_ext.check.record import RolloutRecord
from verl_ext.core.sync_labels import SyncLabel
from verl_ext.core.version_spans import Staleness, lag_of

STRIP_WIDTH = 720  # px of a strip: the rollout's output tokens scaled to it
STRIP_HEIGHT = 14
_PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")
UNSTAMPED_COLOR = "#d0d0d0"
ABORT_COLOR = "#000000"


@dataclass(frozen=True)
class StripPiece:
    """Output tokens ``[start, end)`` of the rollout (all its engine calls' outputs in order) on ``version``."""

    version: int | None
    start: int
    end: int
    turn: int


@dataclass(frozen=True)
class VersionStrip:
    """One rollout's strip: its pieces, the token offsets where an attempt was aborted and resumed, and its
    turn boundaries."""

    pieces: tuple[StripPiece, ...]
    aborts: tuple[int, ...]
    turns: tuple[int, ...]
    tokens: int

    @property
    def versions(self) -> list[int | None]:
        return sorted({p.version for p in self.pieces}, key=lambda v: (v is None, v or 0))


def version_strip(record: RolloutRecord) -> VersionStrip | None:
    """The strip of a rollout's record; None for a record without versions."""
    if record.versions is None:
        return None
    pieces: list[StripPiece] = []
    aborts: list[int] = []
    turns: list[int] = []
    at = 0
    for k, call in enumerate(record.versions.calls):
        turns.append(at)
        for j, a in enumerate(call):
            if a.end > a.start:
                pieces.append(StripPiece(a.version, at + a.start, at + a.end, k))
            if j + 1 < len(call):
                aborts.append(at + a.end)
        at += call[-1].end if call else 0
    return VersionStrip(tuple(pieces), tuple(aborts), tuple(turns), at)


def version_color(version: int | None, versions: Sequence[int | None]) -> str:
    """A version's colour in a strip: by its rank among the strip's versions (None: grey)."""
    if version is None:
        return UNSTAMPED_COLOR
    known = [v for v in versions if v is not None]
    return _PALETTE[known.index(version) % len(_PALETTE)]


def strip_svg(strip: VersionStrip) -> Markup:
    """The strip as inline SVG: a bar per version run (title: version and tokens), a black tick per abort, a grey
    tick per turn start; a legend of its versions."""
    scale = STRIP_WIDTH / max(1, strip.tokens)
    versions = strip.versions
    parts = [
        f'<svg class="version-strip" width="{STRIP_WIDTH}" height="{STRIP_HEIGHT + 16}" '
        'xmlns="http://www.w3.org/2000/svg" role="img">'
    ]
    for p in strip.pieces:
        x, w = p.start * scale, max(1.0, (p.end - p.start) * scale)
        title = escape(
            f"turn {p.turn}: version {p.version if p.version is not None else 'not stamped'}, tokens {p.start}-{p.end}"
        )
        parts.append(
            f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="{STRIP_HEIGHT}" '
            f'fill="{version_color(p.version, versions)}"><title>{title}</title></rect>'
        )
    for t in strip.turns[1:]:
        parts.append(f'<rect x="{t * scale:.1f}" y="0" width="1" height="{STRIP_HEIGHT}" fill="#ffffff"/>')
    for a in strip.aborts:
        parts.append(
            f'<rect x="{a * scale - 1:.1f}" y="-2" width="2" height="{STRIP_HEIGHT + 4}" fill="{ABORT_COLOR}">'
            f"<title>abort, resumed at token {a}</title></rect>"
        )
    x = 0.0
    for v in versions:
        label = escape(f"v{v}" if v is not None else "not stamped")
        parts.append(
            f'<rect x="{x:.0f}" y="{STRIP_HEIGHT + 4}" width="10" height="10" fill="{version_color(v, versions)}"/>'
        )
        parts.append(f'<text x="{x + 13:.0f}" y="{STRIP_HEIGHT + 13}" font-size="10">{label}</text>')
        x += 13 + 7 * len(str(label)) + 10
    parts.append("</svg>")
    return Markup("".join(parts))


@dataclass
class StalenessByStep:
    """Per trained step: token-weighted staleness, the share of turns mixing versions, resumes per turn (what
    ``plots.staleness_plot`` draws: its ``StalenessSeries``); ``unversioned``: rollouts without versions."""

    staleness: dict[int, Staleness] = field(default_factory=dict)
    turns: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    mixed: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    resumes: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    unversioned: int = 0

    @property
    def steps(self) -> list[int]:
        return sorted(self.turns)

    def mean_lag(self, step: int) -> float:
        return self.staleness[step].mean

    def max_lag(self, step: int) -> int:
        return self.staleness[step].max_lag

    def mixed_share(self, step: int) -> float:
        return self.mixed[step] / self.turns[step] if self.turns[step] else 0.0

    def resumes_per_turn(self, step: int) -> float:
        return self.resumes[step] / self.turns[step] if self.turns[step] else 0.0


def staleness_by_step(records: Sequence[RolloutRecord]) -> StalenessByStep:
    """The run's staleness over its trained steps (a rollout without a trained step is keyed by its ``step``)."""
    out = StalenessByStep()
    for rec in records:
        v = rec.versions
        if v is None:
            out.unversioned += 1
            continue
        step = v.trained_step if v.trained_step is not None else rec.step
        out.staleness[step] = out.staleness.get(step, Staleness()) + v.staleness(step)
        for call, spans in zip(v.calls, v.spans(), strict=True):
            out.turns[step] += 1
            out.resumes[step] += max(0, len(call) - 1)
            out.mixed[step] += len({s.version for s in spans if s.tokens and s.version is not None}) > 1
    return out


def lag_text(version: int | None, trained_step: int | None, sync: SyncLabel = SyncLabel.AFTER_UPDATE) -> str:
    """How stale a version is against a trained step under the trainer's ``sync`` convention, for a tooltip."""
    lag = None if version is None or trained_step is None else lag_of(version, trained_step, sync)
    if lag is None:
        return "version unknown"
    return "on-policy" if lag == 0 else f"{lag} version{'s' if lag != 1 else ''} behind"


MAX_STRIPS = 12  # rollouts drawn as strips: the resumed ones first, then the most stale


@dataclass(frozen=True)
class VersionsSection:
    """The report's versions section: the staleness plot, the strips shown (label, step, SVG), and how many rollouts
    had no versions."""

    plot: Markup | None
    strips: tuple[tuple[str, int, Markup], ...]
    unversioned: int


def versions_section(rollouts: Sequence[Any]) -> VersionsSection | None:
    """The section for ``rollouts`` (``load.RolloutRef``: ``where`` and ``record``); None when none has versions."""
    from verl_ext.report.plots import staleness_plot  # matplotlib only where a section is drawn

    series = staleness_by_step([r.record for r in rollouts])
    if not series.steps:
        return None
    with_versions = [r for r in rollouts if r.record.versions is not None]

    def rank(ref: Any) -> tuple[int, float]:
        v = ref.record.versions
        resumes = sum(max(0, len(call) - 1) for call in v.calls)  # a call with no attempt row resumed nothing
        step = v.trained_step if v.trained_step is not None else ref.record.step
        return (-resumes, -v.staleness(step).mean)

    shown = sorted(with_versions, key=rank)[:MAX_STRIPS]
    strips = []
    for ref in shown:
        strip = version_strip(ref.record)
        if strip is not None:
            strips.append((ref.where, ref.record.step, strip_svg(strip)))
    return VersionsSection(staleness_plot(series), tuple(strips), series.unversioned)
