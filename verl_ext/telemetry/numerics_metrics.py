"""Aggregate one step's per-rollout numerics into a flat dict of ``tito/numerics/`` metrics for verl's tracker.

A pure function of the step's ``RolloutNumerics`` (the trainer's numbers, one source) and the count of rollouts
the step could not measure; the trainer hook that gathers them calls it once per step. Buckets merge token-weighted
(a bucket's mean |Δ| over every token of the step in it), as the summaries' sums add.
"""

from __future__ import annotations

from collections.abc import Sequence

from verl_ext.core.numerics import DeltaStats, NumericsOptions, NumericsVerdict, RolloutNumerics, depth_bucket_label

PREFIX = "tito/numerics/"
# Turns past this index are summed into one ``turn/<TURN_METRICS>+`` group: a 1,000-turn rollout must not add
# thousands of series to the tracker.
TURN_METRICS = 16


def _stats(prefix: str, s: DeltaStats) -> dict[str, float]:
    """A group's figures; a group with no token reads 0 (trackers draw continuous lines) and ``tokens`` 0 says so."""
    some = s.count > 0
    return {
        f"{prefix}tokens": float(s.tokens),
        f"{prefix}mean_abs_delta": s.mean_abs if some else 0.0,
        f"{prefix}max_abs_delta": s.max_abs,
        f"{prefix}mean_delta": s.mean_delta if some else 0.0,
        f"{prefix}k3": s.k3 if some else 0.0,
        f"{prefix}nonfinite": float(s.nonfinite),
    }


def worst_rollout(
    numerics: Sequence[RolloutNumerics], options: NumericsOptions
) -> tuple[RolloutNumerics, NumericsVerdict] | None:
    """The rollout whose worst turn or depth bucket has the highest mean |Δ| (a non-finite Δ first), with its
    verdict; None for an empty step."""
    best: tuple[tuple[int, float], RolloutNumerics, NumericsVerdict] | None = None
    for n in numerics:
        v = n.verdict(options)
        key = (n.overall.nonfinite, v.worst_mean_abs)
        if best is None or key > best[0]:
            best = (key, n, v)
    return None if best is None else (best[1], best[2])


def numerics_metrics(
    numerics: Sequence[RolloutNumerics], options: NumericsOptions, unavailable: int = 0
) -> dict[str, float]:
    """Every metric is present (zero when nothing was measured), so trackers draw continuous lines:

    - ``tito/numerics/rollouts`` (measured), ``tito/numerics/numerics_unavailable`` (rollouts of the step with no
      numbers: ``unavailable``, e.g. bypass-mode micro-batches after the step's first update), ``drift_rollouts``
    - ``tito/numerics/{tokens,mean_abs_delta,max_abs_delta,mean_delta,k3,nonfinite}``: over every trained token
    - ``tito/numerics/depth/<lo>-<hi>/...``: the same per depth bucket of ``options.depth_edges`` (every bucket)
    - ``tito/numerics/turn/<k>/...``: per turn index seen (turns from ``TURN_METRICS`` on as ``turn/16+``)
    - ``tito/numerics/worst/{mean_abs_delta,turn,depth,position}``: the worst rollout's worst bucket mean, the turn
      and the depth bucket's lower edge where its drift starts, its first position past the token threshold
      (-1: none)

    Raises ValueError for numerics of several sources (the trainer's and the re-feed audit's compare different
    things: aggregate each apart) or bucketed by other depth edges than ``options``'."""
    sources = sorted({n.source for n in numerics})
    if len(sources) > 1:
        raise ValueError(f"numerics of one step from several sources {sources}: aggregate each source apart")
    edges = tuple(options.depth_edges)
    other = next((n for n in numerics if n.depth_edges != edges), None)
    if other is not None:
        raise ValueError(
            f"numerics of {other.rollout_id!r} were bucketed by depth edges {list(other.depth_edges)}, not the "
            f"options' {list(edges)}: summarize with the same options"
        )
    overall = DeltaStats()
    depth = {b: DeltaStats() for b in range(len(edges))}
    turns: dict[str, DeltaStats] = {}
    drift = 0
    for n in numerics:
        overall = overall.merge(n.overall)
        for b, s in n.by_depth.items():
            depth[b] = depth[b].merge(s)
        for t, s in n.by_turn.items():
            key = str(t) if t < TURN_METRICS else f"{TURN_METRICS}+"
            turns[key] = turns[key].merge(s) if key in turns else s
        drift += n.verdict(options).status == "drift"
    m: dict[str, float] = {
        f"{PREFIX}rollouts": float(len(numerics)),
        f"{PREFIX}numerics_unavailable": float(unavailable),
        f"{PREFIX}drift_rollouts": float(drift),
        **_stats(PREFIX, overall),
    }
    for b, s in depth.items():
        m.update(_stats(f"{PREFIX}depth/{depth_bucket_label(edges, b)}/", s))
    for key in sorted(turns, key=lambda k: int(k.rstrip("+"))):
        m.update(_stats(f"{PREFIX}turn/{key}/", turns[key]))
    worst = worst_rollout(numerics, options)
    v = worst[1] if worst else None
    m[f"{PREFIX}worst/mean_abs_delta"] = v.worst_mean_abs if v else 0.0
    m[f"{PREFIX}worst/turn"] = float(v.turn) if v and v.turn is not None else -1.0
    m[f"{PREFIX}worst/depth"] = float(edges[v.depth_bucket]) if v and v.depth_bucket is not None else -1.0
    m[f"{PREFIX}worst/position"] = float(v.position) if v and v.position is not None else -1.0
    return m
