"""One verdict per rollout in two parts: the tokens (today's check) and the numbers (the numerics view).

The numbers part compares the trainer's recomputed logprob of each sampled token with the engine's. That comparison
means something only where the trainer's tokens are the engine's (the check's engine view found nothing: same
stream, mask and logprobs handed over); where they are not, the numbers part says so and compares nothing. A
template defect (the context differs from the chat template's rendering) leaves the engine's tokens in place, so the
numbers are compared there. This is not the check's ``logprob`` failure: that one proves the loop handed the
trainer the engine's own logprobs; this one compares the trainer's recomputation with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from verl_ext.check.numerics_record import RolloutNumericsView
from verl_ext.core.numerics import NumericsOptions, NumericsVerdict, RolloutNumerics, depth_bucket_label

__all__ = ["TwoPartVerdict", "two_part_verdict"]

TokensPart = Literal["ok", "defect", "failure"]
NumbersPart = Literal["ok", "drift", "not compared", "absent"]


@dataclass(frozen=True)
class TwoPartVerdict:
    """``tokens``: ``ok`` (the engine's tokens, every difference from the template allowed), ``defect`` (the
    engine's tokens, a template difference verl_ext does not allow), ``failure`` (the trainer's tokens, mask or
    logprobs are not the engine's). ``numbers``: ``ok`` / ``drift`` (``numerics`` says where), ``not compared``
    (the tokens are not the engine's), ``absent`` (no numbers recorded: ``numbers_detail`` says why)."""

    tokens: TokensPart
    numbers: NumbersPart
    numbers_detail: str
    numerics: NumericsVerdict | None = None

    @property
    def text(self) -> str:
        """``tokens ok · numbers drift (turn 2, depth 4096-8192, position 4301)``."""
        return f"tokens {self.tokens} · numbers {self.numbers}" + (
            f" ({self.numbers_detail})" if self.numbers_detail else ""
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "numbers": self.numbers,
            "numbers_detail": self.numbers_detail,
            "numerics": self.numerics.to_json() if self.numerics else None,
        }


def where_drift_starts(v: NumericsVerdict, numerics: RolloutNumerics) -> str:
    """``turn 2, depth 4096-8192, position 4301`` (the parts the verdict names)."""
    parts = []
    if v.turn is not None:
        parts.append(f"turn {v.turn}")
    if v.depth_bucket is not None:
        parts.append(f"depth {depth_bucket_label(numerics.depth_edges, v.depth_bucket)}")
    if v.position is not None:
        parts.append(f"position {v.position}")
    return ", ".join(parts)


def two_part_verdict(
    engine_ok: bool,
    defects: int,
    numerics: RolloutNumerics | None,
    options: NumericsOptions,
    absent: str = "no numerics recorded",
) -> TwoPartVerdict:
    """The two-part verdict from the check's result (``engine_ok``, ``defects``: a ``CheckResult``'s or a
    record's ``RecordedCheck``) and the rollout's numbers (None: ``absent`` says why)."""
    tokens: TokensPart = "failure" if not engine_ok else ("defect" if defects else "ok")
    if not engine_ok:
        return TwoPartVerdict(tokens, "not compared", "the trainer's tokens are not the engine's: numbers not compared")
    if numerics is None:
        return TwoPartVerdict(tokens, "absent", absent)
    v = numerics.verdict(options)
    detail = where_drift_starts(v, numerics) if v.status == "drift" else f"max mean |Δ| {v.worst_mean_abs:.2g}"
    return TwoPartVerdict(tokens, v.status, detail, v)


def record_verdict(check: Any, view: RolloutNumericsView) -> TwoPartVerdict:
    """``two_part_verdict`` of a record's ``RecordedCheck`` and its joined numbers (the trainer's, with the
    thresholds they were recorded with)."""
    trainer = view.trainer
    if trainer is None:
        return two_part_verdict(
            check.engine_ok, check.defects, None, NumericsOptions(), view.absent or "no trainer numbers"
        )
    return two_part_verdict(check.engine_ok, check.defects, trainer.numerics, trainer.options)
