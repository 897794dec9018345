"""Generated rollouts for the numerics view: a class of verl responses (engine calls of sampled tokens, mask-0
context between them, partly masked turns, padding), with the engine's and the trainer's logprobs, and a
per-token oracle the summaries are checked against."""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from verl_ext.core.numerics import DEFAULT_DEPTH_EDGES, NumericsOptions, RolloutNumerics, summarize_rollout

GARBAGE = (math.nan, math.inf, -math.inf, 1e6, -50.0, 0.0)


@dataclass(frozen=True)
class NumericsRollout:
    prompt_length: int
    turn_starts: tuple[int, ...]
    mask: tuple[Any, ...]
    engine: tuple[float, ...]
    trainer: tuple[float, ...]
    options: NumericsOptions

    @property
    def trained(self) -> list[int]:
        """Response positions with mask 1."""
        return [i for i, m in enumerate(self.mask) if m]

    def turn_of(self, i: int) -> int:
        return bisect_right(self.turn_starts, i) - 1

    def bucket_of(self, i: int) -> int:
        return bisect_right(self.options.depth_edges, self.prompt_length + i) - 1

    def with_trainer(self, trainer: list[float]) -> NumericsRollout:
        return replace(self, trainer=tuple(trainer))

    def kwargs(self) -> dict[str, Any]:
        return {
            "trainer_logprobs": list(self.trainer),
            "engine_logprobs": list(self.engine),
            "response_mask": list(self.mask),
            "prompt_length": self.prompt_length,
            "turn_starts": list(self.turn_starts),
            "options": self.options,
        }


def make_rollout(rng: random.Random, *, max_turns: int = 8, max_turn_tokens: int = 300) -> NumericsRollout:
    """One rollout: 1..max_turns engine calls (some empty, some partly masked: strict masking, a truncated turn),
    mask-0 context between calls and padding after; mask-0 positions hold garbage logprobs (NaN, inf, 1e6)
    that must never be counted. The trainer's logprobs are the engine's plus noise well under any threshold."""
    random_edges = (0, *sorted(rng.sample(range(1, 4000), rng.randint(0, 6))))
    edges = DEFAULT_DEPTH_EDGES if rng.random() < 0.5 else random_edges
    options = NumericsOptions(depth_edges=edges, drift_mean_abs_delta=0.05, token_abs_delta=0.5)
    prompt_length = rng.choice([0, rng.randrange(1, 3000)])
    one = rng.choice([1, True, 1.0])
    mask: list[Any] = []
    starts: list[int] = []
    n_turns = rng.randint(1, max_turns)
    for t in range(n_turns):
        starts.append(len(mask))
        length = rng.choice([0, rng.randint(1, max_turn_tokens)])
        masked_out = rng.random() < 0.2
        mask += [0 if masked_out and rng.random() < 0.5 else one for _ in range(length)]
        if t < n_turns - 1:
            mask += [0] * rng.randint(0, 60)
    mask += [0] * rng.randint(0, 30)
    engine: list[float] = []
    trainer: list[float] = []
    for m in mask:
        if m:
            e = -rng.expovariate(0.5)
            engine.append(e)
            trainer.append(e + rng.gauss(0.0, 1e-3))
        else:
            engine.append(rng.choice(GARBAGE))
            trainer.append(rng.choice(GARBAGE))
    return NumericsRollout(prompt_length, tuple(starts), tuple(mask), tuple(engine), tuple(trainer), options)


def oracle(r: NumericsRollout) -> dict[str, dict[Any, dict[str, Any]]]:
    """The summaries token by token from per-token lists, with verl's own k3 formula (exp(Δ) - Δ - 1)."""
    thr = r.options.token_abs_delta
    groups: dict[str, dict[Any, list[tuple[int, float]]]] = {"overall": {}, "by_turn": {}, "by_depth": {}}
    for i in r.trained:
        d = r.trainer[i] - r.engine[i]
        pos = r.prompt_length + i
        groups["overall"].setdefault(0, []).append((pos, d))
        groups["by_turn"].setdefault(r.turn_of(i), []).append((pos, d))
        groups["by_depth"].setdefault(r.bucket_of(i), []).append((pos, d))
    out: dict[str, dict[Any, dict[str, Any]]] = {}
    for name, by in groups.items():
        out[name] = {}
        for key, items in by.items():
            ds = [d for _, d in items]
            out[name][key] = {
                "count": len(ds),
                "sum_abs": math.fsum(abs(d) for d in ds),
                "max_abs": max(abs(d) for d in ds),
                "sum_delta": math.fsum(ds),
                "sum_k3": math.fsum(math.exp(d) - d - 1 for d in ds),
                "first_past": min((p for p, d in items if abs(d) > thr), default=None),
            }
    return out


def numerics_of_record(
    record: Any,
    shift: Callable[[int, int], float] = lambda position, turn: 0.0,
    options: NumericsOptions | None = None,
    source: str = "old_log_prob",
) -> RolloutNumerics:
    """A recorded rollout's numerics as the trainer would report them: its trainer logprob of each sampled token is
    the engine's plus ``shift(absolute position, turn)``."""
    p = record.prompt_length
    n = len(record.input_ids)
    engine_at = record.sampled_logprobs
    mask = list(record.loss_mask[p:n])
    engine = [engine_at.get(i, 0.0) for i in range(p, n)]
    trainer = [e + (shift(p + k, record.turn_of[p + k]) if mask[k] else 0.0) for k, e in enumerate(engine)]
    starts = [c.output_start - p for c in record.engine_calls]
    return summarize_rollout(
        record.rollout_id, trainer, engine, mask, p, starts, options or NumericsOptions(), source, step=record.step
    )
