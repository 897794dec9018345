"""Validate what an engine returned before any of it can become a training token.

An engine can hand back ids the tokenizer cannot decode (a sample past the vocabulary, a negative id), logprobs
that are not log-probabilities (NaN, inf, above 0), a logprob list whose length disagrees with the ids, and, under
SGLang, a stop id it substituted for a NaN or out-of-range sample (``finish_reason`` ``{"type": "stop", "matched":
"NaN happened"}``; see SGLang's ``_check_vocab_boundary_finish``). None of these may be trained on. The trajectory
keeps an output only up to its first problem (``trainable_length``), and the check's engine view names each
problem as a failure; both use this one function, so they agree on what is invalid.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# What SGLang puts in ``finish_reason["matched"]`` when it replaced a NaN / out-of-range sample with a stop id.
NAN_HAPPENED = "NaN happened"

# A log-probability is <= 0; a logprob a hair above 0 is rounding in the engine's log_softmax (bf16 under
# --rl-on-policy-target), not a broken engine.
POSITIVE_LOGPROB_TOLERANCE = 1e-3


class OutputProblemKind(StrEnum):
    """What is wrong with an engine output (each is also a ``FailureKind`` of the check's engine view)."""

    NEGATIVE_ID = "negative_id"
    ID_OUT_OF_VOCAB = "id_out_of_vocab"  # the tokenizer cannot decode it
    LOGPROB_COUNT = "logprob_count"  # not one logprob per output id
    LOGPROB_NOT_FINITE = "logprob_not_finite"  # NaN or +-inf
    LOGPROB_POSITIVE = "logprob_positive"  # a probability above 1
    NAN_STOP = "nan_stop"  # a stop id the engine substituted after a NaN sample (never sampled)


@dataclass(frozen=True)
class OutputProblem:
    """One kind of problem in one engine output: where it first occurs, how often, and what it means."""

    kind: OutputProblemKind
    index: int  # position in the output of the first offending token (0 for a count mismatch)
    count: int  # offending tokens (for a count mismatch: the number of logprobs)
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``kind`` as its string value."""
        return {"kind": self.kind.value, "index": self.index, "count": self.count, "detail": self.detail}


def reports_nan(finish_reason: Any) -> bool:
    """Whether the engine's finish reason says a NaN sample was replaced (SGLang's ``matched: "NaN happened"``),
    given as that string or as SGLang's ``{"type": ..., "matched": ...}`` object."""
    if isinstance(finish_reason, Mapping):
        return finish_reason.get("matched") == NAN_HAPPENED
    return finish_reason == NAN_HAPPENED


def validate_engine_output(
    output_ids: Sequence[int],
    logprobs: Sequence[float] | None,
    vocab_size: int | None,
    *,
    stop_ids: Collection[int] = (),
    finish_reason: Any = None,
) -> tuple[OutputProblem, ...]:
    """Every problem in one engine output, in output order. ``vocab_size`` is the tokenizer's (``len(tokenizer)``):
    an id the model's padded embedding has but the tokenizer cannot decode is no training token. ``stop_ids`` are
    the ids an engine ends a turn on: a NaN logprob on the last one is SGLang's substituted stop."""
    ids = output_ids
    if _plainly_valid(ids, logprobs, vocab_size) and not reports_nan(finish_reason):
        return ()  # the common case, checked at C speed (min, max, sum), without building any problem
    problems: list[OutputProblem] = []
    if ids and min(ids) < 0:
        bad = [k for k, i in enumerate(ids) if i < 0]
        problems.append(
            OutputProblem(
                OutputProblemKind.NEGATIVE_ID,
                bad[0],
                len(bad),
                f"id {ids[bad[0]]} at output position {bad[0]} is negative ({len(bad)} such ids): no token has it",
            )
        )
    if ids and vocab_size is not None and max(ids) >= vocab_size:
        bad = [k for k, i in enumerate(ids) if i >= vocab_size]
        problems.append(
            OutputProblem(
                OutputProblemKind.ID_OUT_OF_VOCAB,
                bad[0],
                len(bad),
                f"id {ids[bad[0]]} at output position {bad[0]} is outside the tokenizer's vocabulary of {vocab_size} "
                f"ids ({len(bad)} such ids): the tokenizer cannot decode it, so it is no training token",
            )
        )
    nan_reported = reports_nan(finish_reason)
    if logprobs is not None and len(logprobs) != len(ids):
        problems.append(
            OutputProblem(
                OutputProblemKind.LOGPROB_COUNT,
                0,
                len(logprobs),
                f"{len(ids)} output ids but {len(logprobs)} logprobs: no logprob can be matched to its id",
            )
        )
    elif logprobs is not None and logprobs:
        problems += _logprob_problems(ids, logprobs, stop_ids, nan_reported)
    if nan_reported and ids and not any(p.kind is OutputProblemKind.NAN_STOP for p in problems):
        problems.append(_nan_stop(len(ids) - 1, ids[-1], "the engine reported finish_reason matched 'NaN happened'"))
    return tuple(sorted(problems, key=lambda p: p.index))


def _plainly_valid(ids: Sequence[int], logprobs: Sequence[float] | None, vocab_size: int | None) -> bool:
    """True only when ``validate_engine_output`` would find nothing in the ids and logprobs: ids within
    [0, vocab_size), one finite logprob <= the tolerance per id. False means "look closer", not "invalid": a sum of
    finite logprobs that overflows to -inf sends the output to the per-value checks, which then find nothing."""
    if ids and (min(ids) < 0 or (vocab_size is not None and max(ids) >= vocab_size)):
        return False
    if logprobs is None or not logprobs:
        return logprobs is None or not ids
    return len(logprobs) == len(ids) and math.isfinite(sum(logprobs)) and max(logprobs) <= POSITIVE_LOGPROB_TOLERANCE


def trainable_length(problems: Sequence[OutputProblem], n_ids: int) -> int:
    """How many leading output ids are valid training tokens: all before the first problem (none when the logprob
    count disagrees, since no logprob can be matched to its id)."""
    return min((p.index for p in problems), default=n_ids)


def describe(problems: Sequence[OutputProblem]) -> str:
    """The problems' details joined into one line ("" for none)."""
    return "; ".join(p.detail for p in problems)


def _logprob_problems(
    ids: Sequence[int], logprobs: Sequence[float], stop_ids: Collection[int], nan_reported: bool
) -> list[OutputProblem]:
    total = sum(logprobs)
    if math.isfinite(total) and max(logprobs) <= POSITIVE_LOGPROB_TOLERANCE:
        return []  # the common case, without a Python-level loop over every value
    last = len(ids) - 1
    substituted = last >= 0 and (nan_reported or ids[last] in stop_ids) and not math.isfinite(logprobs[last])
    out: list[OutputProblem] = []
    nonfinite = [k for k, x in enumerate(logprobs) if not math.isfinite(x) and not (substituted and k == last)]
    if nonfinite:
        k = nonfinite[0]
        out.append(
            OutputProblem(
                OutputProblemKind.LOGPROB_NOT_FINITE,
                k,
                len(nonfinite),
                f"logprob at output position {k} is {logprobs[k]} ({len(nonfinite)} not finite): the engine's "
                "forward pass produced NaN or inf",
            )
        )
    positive = [k for k, x in enumerate(logprobs) if x > POSITIVE_LOGPROB_TOLERANCE]
    if positive:
        k = positive[0]
        out.append(
            OutputProblem(
                OutputProblemKind.LOGPROB_POSITIVE,
                k,
                len(positive),
                f"logprob at output position {k} is {logprobs[k]:.6g} > 0 ({len(positive)} positive): not a "
                "log-probability",
            )
        )
    if substituted:
        out.append(_nan_stop(last, ids[last], f"its logprob is {logprobs[last]}"))
    return out


def _nan_stop(index: int, token: int, why: str) -> OutputProblem:
    return OutputProblem(
        OutputProblemKind.NAN_STOP,
        index,
        1,
        f"stop id {token} at output position {index} was substituted by the engine for a NaN or out-of-range sample "
        f"({why}): the model did not sample it",
    )
