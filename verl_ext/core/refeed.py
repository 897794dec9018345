"""The re-feed audit's pure parts: prove a scoring path on a canary, pick the audited rollouts, compare a re-score.

The audit (opt-in, a sampled fraction of rollouts) scores a rollout's final sequence on the engine that sampled it,
before the next weight update, and compares those scores with the logprobs the engine reported while sampling:
where they differ, the engine disagrees with itself (nondeterminism, or a reporting bug), whatever the trainer does.
A scoring path can lie (a teacher-forced endpoint 20-30 nats off while generation matched bit for bit, sparkinfer
#1001), so no score is used before the path passes a canary: the engine generates a sequence and then scores the
same ids; every scored id must be the generated one and every score within ``tolerance`` of the generation's
logprob. The tolerance is the engine's own prefill-vs-generation gap, measured on a trusted setup
(``calibrate_tolerance``), not a number chosen to pass. A path that fails is refused with the reason and never used.

Pure Python: engines and loops call it with plain lists (engines/scoring_canary.py runs the canary on an engine).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.core.numerics import NumericsOptions, RolloutNumerics, summarize_rollout

# The CPU engine's (fp32) prefill-vs-generation gap: at most 1.9e-6 nats over 24 canaries (docs/cpu-engine.md, 2-core
# development machine); 1e-4 leaves two orders of magnitude and still refuses any real lie.
CPU_SCORING_TOLERANCE = 1e-4
REFEED_SOURCE = "refeed"


@dataclass(frozen=True)
class CanaryVerdict:
    """Whether a scoring path reproduced generation on the canary: ``accepted``, the tokens compared, the largest
    |score − generated logprob| and the canary position (0-based among the scored ids) where it is, the tolerance,
    and ``reason`` (a sentence saying why it was refused and what to do; empty when accepted)."""

    engine: str
    accepted: bool
    tokens: int
    max_abs_delta: float
    position: int | None
    tolerance: float
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "accepted": self.accepted,
            "tokens": self.tokens,
            "max_abs_delta": self.max_abs_delta if math.isfinite(self.max_abs_delta) else repr(self.max_abs_delta),
            "position": self.position,
            "tolerance": self.tolerance,
            "reason": self.reason,
        }


def refused(
    engine: str, why: str, tolerance: float, tokens: int = 0, worst: float = math.inf, position: int | None = None
) -> CanaryVerdict:
    """A refused canary: ``why`` says what the scoring path did wrong."""
    reason = (
        f"re-feed audit: the scoring path of {engine} is refused: {why}; its scores are not used and the audit is off "
        "for this engine (check that the scoring request scores the given ids after their context, at the "
        "sampling temperature, on the weights that sampled them)"
    )
    return CanaryVerdict(engine, False, tokens, worst, position, tolerance, reason)


def canary_verdict(
    engine: str,
    generated_ids: Sequence[int],
    generated_logprobs: Sequence[float],
    scored_ids: Sequence[int],
    scored_logprobs: Sequence[float],
    tolerance: float,
) -> CanaryVerdict:
    """Compare a scoring of the canary's ids with their generation: refused when the path scored other ids or another
    count, returned a non-finite score, or differs from generation by more than ``tolerance`` anywhere."""
    if not (tolerance > 0 and math.isfinite(tolerance)):
        raise ValueError(f"re-feed canary: tolerance must be a finite number > 0, got {tolerance!r}")
    n = len(generated_ids)
    if n == 0 or len(generated_logprobs) != n:
        raise ValueError(
            f"re-feed canary: the generation gave {n} ids and {len(generated_logprobs)} logprobs; a canary needs "
            "at least one id with its logprob"
        )
    if len(scored_ids) != n or len(scored_logprobs) != n:
        counts = f"{len(scored_ids)} ids ({len(scored_logprobs)} scores)"
        return refused(engine, f"it scored {counts} for the {n} generated ones", tolerance, n)
    for position, (a, b) in enumerate(zip(generated_ids, scored_ids, strict=True)):
        if int(a) != int(b):
            why = f"it scored id {b} where id {a} was generated (canary position {position})"
            return refused(engine, why, tolerance, n, position=position)
    worst, where = 0.0, 0
    for position, (g, s) in enumerate(zip(generated_logprobs, scored_logprobs, strict=True)):
        delta = abs(float(s) - float(g)) if s is not None and math.isfinite(float(s)) else math.inf
        if delta > worst or math.isnan(delta):
            worst, where = delta, position
    if not worst <= tolerance:
        why = (
            f"its scores differ from generation by up to {worst:.3g} nats (canary position {where}), over its "
            f"tolerance {tolerance:.3g}"
        )
        return refused(engine, why, tolerance, n, worst, where)
    return CanaryVerdict(engine, True, n, worst, where, tolerance)


def calibrate_tolerance(gaps: Sequence[float], margin: float = 10.0, floor: float = 1e-6) -> float:
    """A tolerance from an engine's measured prefill-vs-generation gaps (max |Δ| of canaries run on a trusted setup):
    ``margin`` times the largest, at least ``floor``. Raises ValueError for no gaps or a non-finite one."""
    if not gaps or not all(math.isfinite(g) and g >= 0 for g in gaps):
        raise ValueError(f"re-feed calibration: gaps must be finite numbers >= 0 (one per canary), got {list(gaps)}")
    if not (margin >= 1 and floor > 0):
        raise ValueError(f"re-feed calibration: margin must be >= 1 and floor > 0, got {margin!r} and {floor!r}")
    return max(floor, margin * max(gaps))


def audited(rollout_id: str, fraction: float) -> bool:
    """Whether the audit scores this rollout: a fixed ``fraction`` of rollout ids, chosen by a hash of the id (the same
    answer in every process and run), so the sample is unbiased by order or timing."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"re-feed audit: fraction must be in [0, 1], got {fraction!r}")
    if fraction == 0.0:
        return False
    draw = int.from_bytes(hashlib.blake2b(rollout_id.encode(), digest_size=8).digest(), "big") / 2.0**64
    return draw < fraction


@dataclass(frozen=True)
class RefeedResult:
    """One audited rollout: its numerics (Δ = re-score − sampled logprob, ``source="refeed"``), or ``None`` with
    ``reason`` when the re-score cannot be compared; the weight versions that sampled and scored it."""

    rollout_id: str
    sampled_version: Any
    scored_version: Any
    numerics: RolloutNumerics | None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id,
            "sampled_version": self.sampled_version,
            "scored_version": self.scored_version,
            "numerics": self.numerics.to_json() if self.numerics is not None else None,
            "reason": self.reason,
        }


def refeed_numerics(
    rollout_id: str,
    scored_logprobs: Sequence[float],
    sampled_logprobs: Sequence[float],
    response_mask: Sequence[int],
    prompt_length: int,
    turn_starts: Sequence[int],
    options: NumericsOptions,
    *,
    sampled_version: Any,
    scored_version: Any,
    canary: CanaryVerdict,
    step: int | None = None,
) -> RefeedResult:
    """Compare the re-score of a rollout's response positions with its sampled logprobs (only mask-1 tokens count;
    see ``summarize_rollout``). Not compared, with the reason: a refused canary (the path is never used), or a
    re-score on other weights than the sampling (a weight update came between: the gap would be the update's)."""
    if not canary.accepted:
        return RefeedResult(rollout_id, sampled_version, scored_version, None, canary.reason)
    if sampled_version != scored_version:
        return RefeedResult(
            rollout_id,
            sampled_version,
            scored_version,
            None,
            f"re-feed audit: rollout {rollout_id} was sampled on weights {sampled_version!r} and re-scored on "
            f"{scored_version!r}: a weight update came between, so the re-score is not compared (the audit must "
            "run before the next weight update)",
        )
    numerics = summarize_rollout(
        rollout_id,
        list(scored_logprobs),
        list(sampled_logprobs),
        list(response_mask),
        prompt_length,
        list(turn_starts),
        options,
        REFEED_SOURCE,
        step,
    )
    return RefeedResult(rollout_id, sampled_version, scored_version, numerics)
