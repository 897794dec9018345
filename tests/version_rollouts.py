"""Synthetic engine calls across aborts and weight updates, as the CPU engine and verl_ext's SGLang server return
them: a generator of turns, each one or more attempts, the weights bumped between an abort and its resume; and the
defects the version view must catch, each injected into a clean rollout.

``attempt_outputs`` gives what a truthful engine reports per attempt (its ids, logprobs and ``verl_ext_engine``
report with the dispatch and stop versions and the CRC of the prompt it received); ``turn_segments`` joins them as
``plugin.engine_turn.generate_turn`` does (``core.version_spans.segment`` per attempt).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from verl_ext.check.inputs import EngineCall
from verl_ext.core.version_spans import (
    DISPATCH_VERSION_FIELD,
    PROMPT_CRC_FIELD,
    STOP_VERSION_FIELD,
    ids_crc,
    segment,
)


@dataclass
class Attempted:
    """One attempt as the engine returned it, and the truth: the version that generated its ids."""

    ids: list[int]
    logprobs: list[float]
    stop_reason: str
    report: dict[str, Any]
    truth: int


@dataclass
class SyntheticRollout:
    """Engine calls (one per turn) with each turn's attempts and segments, and the versions that truly generated
    each output token."""

    calls: list[EngineCall] = field(default_factory=list)
    attempts: list[list[Attempted]] = field(default_factory=list)
    segments: list[list[dict[str, Any]]] = field(default_factory=list)
    truth: list[list[int]] = field(default_factory=list)  # per call, the version of each output token


def turn_segments(attempts: list[Attempted]) -> tuple[list[int], list[float], list[dict[str, Any]]]:
    """The turn's joined ids, logprobs and segments, as engine_turn joins its calls."""
    ids: list[int] = []
    lps: list[float] = []
    segs: list[dict[str, Any]] = []
    for a in attempts:
        complete = a.stop_reason != "abort" and a.report.get("complete", True)
        segs.append(segment(len(ids), a.ids, a.stop_reason, complete, a.report, {}, a.logprobs))
        ids += a.ids
        lps += a.logprobs
    return ids, lps, segs


def make_rollout(
    rng: random.Random, turns: int = 6, abort_rate: float = 0.4, cut_rate: float = 0.0
) -> SyntheticRollout:
    """A rollout of ``turns`` turns; each turn aborted (weights bumped, then resumed) with ``abort_rate`` per
    attempt, at most 3 times; ``cut_rate``: an aborted attempt's last ids cut by the id check."""
    out = SyntheticRollout()
    version = rng.randint(0, 5)
    stream = [rng.randrange(100, 1000) for _ in range(rng.randint(4, 12))]
    for _ in range(turns):
        prompt = list(stream)
        attempts: list[Attempted] = []
        done: list[int] = []
        while True:
            n = rng.randint(1, 9)
            new = [rng.randrange(100, 1000) for _ in range(n)]
            aborted = len(attempts) < 3 and rng.random() < abort_rate
            cut = rng.randint(1, 3) if aborted and rng.random() < cut_rate else 0
            report = {
                DISPATCH_VERSION_FIELD: version,
                STOP_VERSION_FIELD: version,
                "weight_version": str(version + 1 if aborted else version),  # read on return, after the update
                PROMPT_CRC_FIELD: ids_crc(prompt + done),
                **({"ids_match_logprobs": False, "returned_ids": n + cut, "kept_ids": n} if cut else {}),
            }
            lps = [-rng.random() * 3 for _ in new]
            attempts.append(Attempted(new, lps, "abort" if aborted else "stop", report, version))
            done += new
            if not aborted:
                break
            version += 1  # the weight update that aborted it, before the resume
        ids, lps, segs = turn_segments(attempts)
        out.calls.append(EngineCall.of(prompt, ids, lps))
        out.attempts.append(attempts)
        out.segments.append(segs)
        out.truth.append([a.truth for a in attempts for _ in a.ids])
        stream = prompt + ids + [rng.randrange(100, 1000) for _ in range(rng.randint(2, 6))]  # the tool's reply
        if rng.random() < 0.3:
            version += 1  # an update between turns
    return out
