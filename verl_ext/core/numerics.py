"""The numbers half of "training on what was sampled": per rollout, the trainer's logprob of each sampled token
beside the engine's, summarized per turn and per context-depth bucket.

Δ = trainer − engine logprob, over the tokens the trainer trains on (response mask 1) only. A summary
(``DeltaStats``) holds count, Σ|Δ|, max |Δ|, ΣΔ, Σk3 and the first position whose |Δ| passes the per-token
threshold: sums, never per-token lists, so summaries of parts of a rollout merge into the summary of the whole.
k3 is verl 0.9.1's ``rollout_corr/k3_kl`` estimator per token (``rollout_corr_helper.compute_offpolicy_metrics``):
with ``r = Δ``, ``exp(r) - r - 1``, averaged over mask-1 tokens (computed here as ``expm1(r) - r``: the same value,
without the cancellation at small ``r``).

Depth is a token's absolute position in the full sequence, prompt included (as Tinker's ``rl_numerics_check``
plots it); a depth bucket is named by its index into the lower edges ``depth_edges``. Pure Python: nothing here
imports verl, Ray, torch or numpy.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, islice
from typing import Any, Literal

__all__ = [
    "DEFAULT_DEPTH_EDGES",
    "DEFAULT_DRIFT_MEAN_ABS_DELTA",
    "DEFAULT_TOKEN_ABS_DELTA",
    "SOURCES",
    "DeltaStats",
    "NumericsOptions",
    "NumericsVerdict",
    "POLICIES",
    "RolloutNumerics",
    "depth_bucket_label",
    "summarize_rollout",
]

# Lower edges of the depth buckets, in tokens: doubling from 512 to 64K, so the published long-context bug (0.02 in
# the first 8K tokens, 0.16 past 64K: Tinker cookbook's rl_numerics_check) falls in buckets of its own.
DEFAULT_DEPTH_EDGES: tuple[int, ...] = (0, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
# docs/numerics.md justifies both defaults.
DEFAULT_DRIFT_MEAN_ABS_DELTA = 0.05
DEFAULT_TOKEN_ABS_DELTA = 0.5
# What a drifting rollout costs it: warn (logged and reported) or strict (masked out of the loss, counted).
POLICIES: tuple[str, ...] = ("warn", "strict")

# Where the trainer's logprobs came from: the recompute (old-logprob) pass, the policy loss in bypass mode, or the
# re-feed audit's re-score on the engine.
SOURCES: tuple[str, ...] = ("old_log_prob", "bypass_loss", "refeed")

# Record files are strict JSON: a sum that overflowed (k3 of a Δ past ~709 nats) is written as one of these strings.
_NON_FINITE_JSON = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _position(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError("a bool is not a token position")
    return operator.index(value)


def _k3(delta: float) -> float:
    try:
        return math.expm1(delta) - delta
    except OverflowError:  # Δ past ~709 nats: torch's exp gives inf, so does this
        return math.inf


@dataclass(frozen=True)
class NumericsOptions:
    """The numerics view's thresholds, depth buckets and policy (``verl_ext.numerics`` in the options)."""

    depth_edges: tuple[int, ...] = DEFAULT_DEPTH_EDGES
    drift_mean_abs_delta: float = DEFAULT_DRIFT_MEAN_ABS_DELTA  # a bucket (depth or turn) whose mean |Δ| passes it
    token_abs_delta: float = DEFAULT_TOKEN_ABS_DELTA  # one token's |Δ| past it: "first position past the threshold"
    # warn: a drifting rollout is logged and reported; strict: also masked out of the loss where its numbers were
    # compared (its tokens the engine's), counted in tito/numerics/masked
    policy: str = "warn"
    refeed_fraction: float = 0.0  # rollouts re-scored by the engine that sampled them (core/refeed.py); 0: off

    def problems(self, where: str = "verl_ext.numerics") -> list[str]:
        """What is wrong with these options, each a sentence naming the option, the problem and the fix; empty
        when they can be used."""
        out: list[str] = []
        edges = self.depth_edges
        if (
            not isinstance(edges, tuple | list)
            or not edges
            or any(isinstance(e, bool) or not isinstance(e, int) for e in edges)
        ):
            out.append(
                f"{where}.depth_edges must be a non-empty list of integer token positions (lower edges of the depth "
                f"buckets), got {edges!r}; write e.g. {list(DEFAULT_DEPTH_EDGES)}"
            )
        elif edges[0] != 0:
            out.append(
                f"{where}.depth_edges must start at 0 (every token needs a bucket), got {list(edges)}; "
                f"put 0 first: {[0, *[e for e in edges if e > 0]]}"
            )
        elif any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
            out.append(
                f"{where}.depth_edges must be strictly increasing, got {list(edges)}; "
                f"sort them and drop repeats: {sorted(set(edges))}"
            )
        for name in ("drift_mean_abs_delta", "token_abs_delta"):
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
            if not ok:
                out.append(
                    f"{where}.{name} must be a positive finite number of nats (|trainer - engine| logprob), got "
                    f"{value!r}; the default is {getattr(NumericsOptions, name)}"
                )
        if self.policy not in POLICIES:
            out.append(
                f"{where}.policy must be one of {list(POLICIES)} (warn: log and report a drifting rollout; strict: "
                f"also mask it out of the loss), got {self.policy!r}; write {where}.policy=warn or "
                f"{where}.policy=strict"
            )
        f = self.refeed_fraction
        if not (isinstance(f, int | float) and not isinstance(f, bool) and 0 <= f <= 1):
            out.append(
                f"{where}.refeed_fraction must be a number from 0 (off) to 1 (every rollout re-scored), got {f!r}; "
                "e.g. 0.05 re-scores one rollout in twenty"
            )
        return out


def depth_bucket_of(edges: Sequence[int], position: int) -> int:
    """The index of the depth bucket an absolute position falls in (edges: lower edges, first 0)."""
    return bisect_right(edges, position) - 1


def depth_bucket_label(edges: Sequence[int], index: int) -> str:
    """``"512-1024"`` for a bucket with an upper edge (exclusive), ``"65536+"`` for the last."""
    lo = edges[index]
    return f"{lo}+" if index + 1 >= len(edges) else f"{lo}-{edges[index + 1]}"


class DeltaStats:
    """A mergeable summary of Δ over some tokens. ``nonfinite`` counts tokens whose Δ is NaN or infinite (a NaN
    logprob on either side): they enter no sum, and do pass the per-token threshold."""

    __slots__ = ("count", "first_past", "max_abs", "nonfinite", "sum_abs", "sum_delta", "sum_k3")

    def __init__(
        self,
        count: int = 0,
        sum_abs: float = 0.0,
        max_abs: float = 0.0,
        sum_delta: float = 0.0,
        sum_k3: float = 0.0,
        first_past: int | None = None,
        nonfinite: int = 0,
    ) -> None:
        self.count = count  # finite tokens summed
        self.sum_abs = sum_abs
        self.max_abs = max_abs
        self.sum_delta = sum_delta
        self.sum_k3 = sum_k3
        self.first_past = first_past  # absolute position of the first token past token_abs_delta, or None
        self.nonfinite = nonfinite

    def add(self, delta: float, position: int, token_abs_delta: float) -> None:
        """One token's Δ at absolute ``position``."""
        if not math.isfinite(delta):
            self.nonfinite += 1
            self._past(position)
            return
        a = abs(delta)
        self.count += 1
        self.sum_abs += a
        self.sum_delta += delta
        self.sum_k3 += _k3(delta)
        if a > self.max_abs:
            self.max_abs = a
        if a > token_abs_delta:
            self._past(position)

    def _past(self, position: int) -> None:
        if self.first_past is None or position < self.first_past:
            self.first_past = position

    def copy(self) -> DeltaStats:
        return DeltaStats(
            self.count, self.sum_abs, self.max_abs, self.sum_delta, self.sum_k3, self.first_past, self.nonfinite
        )

    def absorb(self, other: DeltaStats) -> None:
        """Add ``other``'s tokens to this summary in place (``merge`` without a new object)."""
        self.count += other.count
        self.sum_abs += other.sum_abs
        self.max_abs = max(self.max_abs, other.max_abs)
        self.sum_delta += other.sum_delta
        self.sum_k3 += other.sum_k3
        self.nonfinite += other.nonfinite
        if other.first_past is not None:
            self._past(other.first_past)

    def merge(self, other: DeltaStats) -> DeltaStats:
        """The summary of both token sets (disjoint: a token seen twice is counted twice)."""
        firsts = [p for p in (self.first_past, other.first_past) if p is not None]
        return DeltaStats(
            self.count + other.count,
            self.sum_abs + other.sum_abs,
            max(self.max_abs, other.max_abs),
            self.sum_delta + other.sum_delta,
            self.sum_k3 + other.sum_k3,
            min(firsts) if firsts else None,
            self.nonfinite + other.nonfinite,
        )

    @property
    def tokens(self) -> int:
        """Every token seen, finite or not."""
        return self.count + self.nonfinite

    @property
    def mean_abs(self) -> float:
        """Mean |Δ| over finite tokens; NaN when there are none."""
        return self.sum_abs / self.count if self.count else math.nan

    @property
    def mean_delta(self) -> float:
        return self.sum_delta / self.count if self.count else math.nan

    @property
    def k3(self) -> float:
        """verl's k3_kl over these tokens: mean of exp(Δ) - Δ - 1."""
        return self.sum_k3 / self.count if self.count else math.nan

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "sum_abs": self.sum_abs,
            "max_abs": self.max_abs,
            "sum_delta": self.sum_delta,
            "sum_k3": self.sum_k3,
            "first_past": self.first_past,
            "nonfinite": self.nonfinite,
        }

    @classmethod
    def from_json(cls, d: Any, where: str = "numerics") -> DeltaStats:
        """Raises ValueError naming ``where`` and the key for a missing key, an unknown one or a wrong type."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{where} must be an object of DeltaStats fields, got {type(d).__name__}")
        keys = set(cls.__slots__)
        unknown = sorted(set(d) - keys)
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r}; a DeltaStats has {sorted(keys)}")
        for k in ("count", "sum_abs", "max_abs", "sum_delta", "sum_k3"):
            if k not in d:
                raise ValueError(f"{where}: missing key {k!r}")
        ints = {"count": d["count"], "nonfinite": d.get("nonfinite", 0)}
        for k, v in ints.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{where}.{k} must be a non-negative integer, got {v!r}")
        nums: dict[str, float] = {}
        for k in ("sum_abs", "max_abs", "sum_delta", "sum_k3"):
            v = d[k]
            if isinstance(v, str) and v in _NON_FINITE_JSON:  # a record file's strict JSON (an overflowing k3)
                nums[k] = _NON_FINITE_JSON[v]
            elif isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f'{where}.{k} must be a number (or "Infinity", "NaN"), got {v!r}')
            else:
                nums[k] = float(v)
        first = d.get("first_past")
        if first is not None and (isinstance(first, bool) or not isinstance(first, int) or first < 0):
            raise ValueError(f"{where}.first_past must be a token position or null, got {first!r}")
        return cls(
            ints["count"], nums["sum_abs"], nums["max_abs"], nums["sum_delta"], nums["sum_k3"], first, ints["nonfinite"]
        )

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, s) for s in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeltaStats) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return "DeltaStats(" + ", ".join(f"{s}={getattr(self, s)!r}" for s in self.__slots__) + ")"


@dataclass(frozen=True)
class NumericsVerdict:
    """The numbers half of a rollout's verdict. ``drift``: some turn or depth bucket's mean |Δ| passes
    ``drift_mean_abs_delta``, or a token's Δ is not finite. ``turn`` and ``depth_bucket`` are the first (lowest)
    turn and depth bucket that drift; ``position`` the first absolute position past ``token_abs_delta`` inside a
    drifting turn or bucket (None when the drift is spread thin: no single token passes); ``worst_mean_abs`` the
    highest mean |Δ| of any turn or bucket."""

    status: Literal["ok", "drift"]
    turn: int | None = None
    depth_bucket: int | None = None
    position: int | None = None
    worst_mean_abs: float = 0.0
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _merge_maps(a: Mapping[int, DeltaStats], b: Mapping[int, DeltaStats]) -> dict[int, DeltaStats]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out[k].merge(v) if k in out else v
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class RolloutNumerics:
    """One rollout's Δ summaries: overall, per turn (index of the engine call that sampled the token) and per depth
    bucket (index into ``depth_edges``)."""

    rollout_id: str
    step: int | None
    source: str
    overall: DeltaStats
    by_turn: dict[int, DeltaStats]
    by_depth: dict[int, DeltaStats]
    depth_edges: tuple[int, ...] = DEFAULT_DEPTH_EDGES

    def merge(self, other: RolloutNumerics) -> RolloutNumerics:
        """The same rollout's summaries over two disjoint token sets (two parts seen apart). Raises ValueError
        for another rollout, source or depth edges: their sums do not add."""
        for name in ("rollout_id", "source", "depth_edges"):
            if getattr(self, name) != getattr(other, name):
                raise ValueError(
                    f"cannot merge numerics of {self.rollout_id!r} with {other.rollout_id!r}: "
                    f"{name} {getattr(self, name)!r} != {getattr(other, name)!r}"
                )
        return RolloutNumerics(
            self.rollout_id,
            self.step if self.step is not None else other.step,
            self.source,
            self.overall.merge(other.overall),
            _merge_maps(self.by_turn, other.by_turn),
            _merge_maps(self.by_depth, other.by_depth),
            self.depth_edges,
        )

    def verdict(self, options: NumericsOptions) -> NumericsVerdict:
        """``ok`` or ``drift`` (class docstring of ``NumericsVerdict``); thresholds from ``options``."""
        thr = options.drift_mean_abs_delta
        drift_turns = [t for t, s in self.by_turn.items() if s.nonfinite or (s.count and s.mean_abs > thr)]
        drift_depths = [b for b, s in self.by_depth.items() if s.nonfinite or (s.count and s.mean_abs > thr)]
        means = [s.mean_abs for s in (*self.by_turn.values(), *self.by_depth.values()) if s.count]
        worst = max(means, default=0.0)
        if not drift_turns and not drift_depths:
            n = self.overall.tokens
            return NumericsVerdict(
                "ok", worst_mean_abs=worst, reason=f"{n} tokens, every turn and depth bucket within {thr}"
            )
        firsts = [
            s.first_past
            for s in (*(self.by_turn[t] for t in drift_turns), *(self.by_depth[b] for b in drift_depths))
            if s.first_past is not None
        ]
        turn = min(drift_turns, default=None)
        depth = min(drift_depths, default=None)
        where = []
        if turn is not None:
            where.append(f"turn {turn}")
        if depth is not None:
            where.append(f"depth {depth_bucket_label(self.depth_edges, depth)}")
        if self.overall.nonfinite:
            why = f"{self.overall.nonfinite} tokens with a non-finite Δ"
        else:
            why = f"mean |Δ| {worst:.3g} > {thr}"
        return NumericsVerdict(
            "drift",
            turn=turn,
            depth_bucket=depth,
            position=min(firsts, default=None),
            worst_mean_abs=worst,
            reason=f"{why}, from {' and '.join(where)}",
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id,
            "step": self.step,
            "source": self.source,
            "depth_edges": list(self.depth_edges),
            "overall": self.overall.to_json(),
            "by_turn": {str(k): v.to_json() for k, v in self.by_turn.items()},
            "by_depth": {str(k): v.to_json() for k, v in self.by_depth.items()},
        }

    @classmethod
    def from_json(cls, d: Any, where: str = "numerics") -> RolloutNumerics:
        """Raises ValueError naming ``where`` and the key for anything malformed."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{where} must be an object, got {type(d).__name__}")
        keys = {"rollout_id", "step", "source", "depth_edges", "overall", "by_turn", "by_depth"}
        unknown = sorted(set(d) - keys)
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r}; numerics has {sorted(keys)}")
        missing = sorted(keys - set(d) - {"step"})
        if missing:
            raise ValueError(f"{where}: missing key {missing[0]!r}")
        if not isinstance(d["rollout_id"], str):
            raise ValueError(f"{where}.rollout_id must be a string, got {d['rollout_id']!r}")
        step = d.get("step")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise ValueError(f"{where}.step must be an integer or null, got {step!r}")
        if d["source"] not in SOURCES:
            raise ValueError(f"{where}.source must be one of {list(SOURCES)}, got {d['source']!r}")
        edges = d["depth_edges"]
        if not isinstance(edges, list):
            raise ValueError(f"{where}.depth_edges must be a list of integers, got {edges!r}")
        problems = NumericsOptions(depth_edges=tuple(edges)).problems(f"{where}")
        if problems:
            raise ValueError(problems[0])

        def buckets(key: str, limit: int | None) -> dict[int, DeltaStats]:
            m = d[key]
            if not isinstance(m, Mapping):
                raise ValueError(f"{where}.{key} must be an object keyed by index, got {type(m).__name__}")
            out: dict[int, DeltaStats] = {}
            for k, v in m.items():
                if not (isinstance(k, str) and k.isdigit()) or (limit is not None and int(k) >= limit):
                    bound = f" below {limit}" if limit is not None else ""
                    raise ValueError(f"{where}.{key}: key {k!r} is not an index{bound}")
                out[int(k)] = DeltaStats.from_json(v, f"{where}.{key}.{k}")
            return dict(sorted(out.items()))

        return cls(
            d["rollout_id"],
            step,
            d["source"],
            DeltaStats.from_json(d["overall"], f"{where}.overall"),
            buckets("by_turn", None),
            buckets("by_depth", len(edges)),
            tuple(edges),
        )


CHUNK = 4096  # the longest segment summarize_rollout sums at once (response positions)


def _segment(
    trainer: Sequence[float], engine: Sequence[float], mask: Sequence[Any], offset: int, thr: float
) -> DeltaStats | None:
    """The summary of one segment's trained tokens (None: it has none); positions are ``offset`` + index. Δ, |Δ|
    and the sums run in C builtins (compress, map, sum) over the trained tokens only: mask-0 positions are never
    read. k3 is summed as Σexpm1(Δ) − ΣΔ, the same sum (its rounding relative to Σk3 about 2e-16/|Δ|: 2e-5 at the
    1e-11 of a clean CPU run); past expm1's range (Δ ≈ 709.78) the segment takes _k3 per token, and a segment with a
    non-finite Δ takes ``DeltaStats.add`` per token."""
    deltas = list(map(operator.sub, compress(trainer, mask), compress(engine, mask)))
    if not deltas:
        return None
    abses = list(map(abs, deltas))
    sum_abs = sum(abses)
    if not math.isfinite(sum_abs):  # a NaN or infinity among them (or a sum past float range): token by token
        slow = DeltaStats()
        for i in compress(range(len(mask)), mask):
            slow.add(trainer[i] - engine[i], offset + i, thr)
        return slow
    sum_delta = sum(deltas)
    sum_k3 = sum(map(_k3, deltas)) if max(deltas) >= 700.0 else sum(map(math.expm1, deltas)) - sum_delta
    out = DeltaStats(len(deltas), sum_abs, max(abses), sum_delta, sum_k3)
    if out.max_abs > thr:
        k = next(k for k, x in enumerate(abses) if x > thr)  # the k-th trained token of the segment
        out.first_past = offset + next(islice(compress(range(len(mask)), mask), k, None))
    return out


def _checked_positions(
    rollout_id: str,
    trainer_logprobs: Sequence[float],
    engine_logprobs: Sequence[float],
    response_mask: Sequence[Any],
    prompt_length: int,
    turn_starts: Sequence[int],
    source: str,
) -> tuple[int, list[int]]:
    """summarize_rollout's input checks (its docstring lists the ValueErrors); the prompt length and turn starts
    as Python ints."""
    n = len(trainer_logprobs)
    if len(engine_logprobs) != n or len(response_mask) != n:
        raise ValueError(
            f"numerics of rollout {rollout_id!r}: trainer logprobs, engine logprobs and response mask must have one "
            f"entry per response position, got {n}, {len(engine_logprobs)} and {len(response_mask)}"
        )
    if source not in SOURCES:
        raise ValueError(f"numerics of rollout {rollout_id!r}: source must be one of {list(SOURCES)}, got {source!r}")
    try:  # numpy and torch integers pass (operator.index), floats and bools do not
        if isinstance(prompt_length, bool) or isinstance(turn_starts, str | bytes):
            raise TypeError
        prompt_length = operator.index(prompt_length)
        starts = [_position(s) for s in turn_starts]
    except TypeError:
        starts = None
    if starts is None or prompt_length < 0:
        raise ValueError(
            f"numerics of rollout {rollout_id!r}: prompt_length must be an integer >= 0 and turn_starts a list of "
            f"integers, got {prompt_length!r} and {turn_starts!r}"
        )
    if any(s < 0 for s in starts) or any(b < a for a, b in zip(starts, starts[1:], strict=False)):
        raise ValueError(
            f"numerics of rollout {rollout_id!r}: turn_starts must be non-decreasing response positions >= 0 (one "
            f"per engine call), got {starts}"
        )
    values = set(response_mask)
    if not values <= {0, 1}:
        bad = sorted(map(repr, values - {0, 1}))[0]
        raise ValueError(f"numerics of rollout {rollout_id!r}: response mask values must be 0 or 1, got {bad}")
    first_trained = next((i for i, m in enumerate(response_mask) if m), None)
    if first_trained is not None and (not starts or first_trained < starts[0]):
        raise ValueError(
            f"numerics of rollout {rollout_id!r}: response position {first_trained} is trained (mask 1) but no turn "
            f"starts at or before it (turn_starts {starts}); the first engine call's tokens start at 0"
        )
    return prompt_length, starts


def _summarize_segments(
    trainer_logprobs: Sequence[float],
    engine_logprobs: Sequence[float],
    response_mask: Sequence[Any],
    prompt_length: int,
    starts: list[int],
    options: NumericsOptions,
) -> tuple[dict[int, DeltaStats], dict[int, DeltaStats]]:
    """The per-turn and per-depth-bucket summaries of checked inputs."""
    n = len(trainer_logprobs)
    edges = options.depth_edges
    thr = options.token_abs_delta
    # Segments where turn and depth bucket are both constant, at most CHUNK positions long (a cut every CHUNK keeps
    # each segment's lists in cache: a 200,000-token rollout costs per token what a 2,000-token one does). Each
    # segment's summary goes to its turn and its bucket.
    cuts = {0, n}
    cuts.update(s for s in starts if 0 < s < n)
    cuts.update(e - prompt_length for e in edges if 0 < e - prompt_length < n)
    cuts.update(range(CHUNK, n, CHUNK))
    bounds = sorted(cuts)
    by_turn: dict[int, DeltaStats] = {}
    by_depth: dict[int, DeltaStats] = {}
    for a, b in zip(bounds, bounds[1:], strict=False):
        seg = _segment(trainer_logprobs[a:b], engine_logprobs[a:b], response_mask[a:b], prompt_length + a, thr)
        if seg is None:
            continue
        turn = bisect_right(starts, a) - 1
        depth = bisect_right(edges, prompt_length + a) - 1
        if turn in by_turn:
            by_turn[turn].absorb(seg)
        else:
            by_turn[turn] = seg
        if depth in by_depth:
            by_depth[depth].absorb(seg)
        else:
            by_depth[depth] = seg.copy()  # the turn's and the bucket's summaries grow apart
    return by_turn, by_depth


def summarize_rollout(
    rollout_id: str,
    trainer_logprobs: Sequence[float],
    engine_logprobs: Sequence[float],
    response_mask: Sequence[Any],
    prompt_length: int,
    turn_starts: Sequence[int],
    options: NumericsOptions,
    source: str,
    step: int | None = None,
) -> RolloutNumerics:
    """Summaries of Δ = trainer − engine logprob over a rollout's response positions where the mask is 1.

    The three sequences cover the response positions (equal lengths; padding past the response has mask 0): lists
    of Python numbers (a tensor's ``.tolist()``; a tensor itself works, one element at a time, far slower).
    A token's depth is ``prompt_length`` + its response position; its turn is the index of the last
    ``turn_starts`` entry (response-relative start of each engine call's sampled tokens, non-decreasing) at or
    before it. Raises ValueError naming the problem for unequal lengths, a mask value other than 0/1, a mask-1
    token before the first turn start, or a bad source or turn start."""
    prompt_length, starts = _checked_positions(
        rollout_id, trainer_logprobs, engine_logprobs, response_mask, prompt_length, turn_starts, source
    )
    by_turn, by_depth = _summarize_segments(
        trainer_logprobs, engine_logprobs, response_mask, prompt_length, starts, options
    )
    overall = DeltaStats()
    for stats in by_depth.values():  # a handful of buckets: every token is in exactly one
        overall.absorb(stats)
    return RolloutNumerics(rollout_id, step, source, overall, by_turn, by_depth, tuple(options.depth_edges))
