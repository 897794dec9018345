"""What the numerics view costs per token: ``summarize_rollout`` from 10 to 1,000 turns, on synthetic logprobs.

Two shapes of rollout, after a 1,000-token prompt, each engine call 80% sampled tokens (mask 1) and 20% tool context
(mask 0), trainer logprobs the engine's plus noise of 1e-3:

- ``per-turn``: 200 response tokens per turn, so 10 turns are 2,000 tokens and 1,000 turns 200,000: whether the cost
  per token stays flat as rollouts grow (no work that grows with the turns so far);
- ``split``: the same 20,000 response tokens (``--tokens``) split into 10, 100 or 1,000 turns (20 tokens a turn at
  1,000): what each turn's own summary costs on top of the per-token work.

Timed on the same lists, taking turns within each run (each method kept at its fastest run, ``bench/_timing.py``):

- ``summarize``: ``summarize_rollout`` (per turn and per depth bucket: count, Σ|Δ|, max, ΣΔ, Σk3, first position);
- ``record``: that, then the numerics line as the writer serializes it (``numerics_record`` + ``to_json_line``);
- ``floor``: the least any per-token figure costs in Python, one pass: the masked mean |Δ| (a generator over the
  three lists), the baseline the ratios are read against;
- ``torch``: the same masked mean |Δ| in torch on one row tensor built outside the timing (what a trainer computes
  with its tensors already there).

Printed: per-token microseconds of each, ``summarize`` over the floor in the same run, and the flatness (the
1,000-turn rollout's per-token cost over the 10-turn one's, per shape). No trainer forward: the cost against verl's
old-logprob pass on the same batch needs the trainer and is measured where the trainer hook runs.
Usage: ``python bench/numerics_cost.py [--tokens 20000] [--runs 15] [--out build/bench]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _timing import fastest  # noqa: E402

from verl_ext.core.numerics import NumericsOptions, summarize_rollout  # noqa: E402
from verl_ext.telemetry.records import numerics_record, to_json_line  # noqa: E402

TURNS = (10, 100, 1000)
PROMPT = 1000


def rollout(turns: int, tokens: int, rng: random.Random) -> dict:
    per_turn = tokens // turns
    sampled = max(1, per_turn * 4 // 5)
    mask: list[int] = []
    starts: list[int] = []
    for _ in range(turns):
        starts.append(len(mask))
        mask += [1] * sampled + [0] * (per_turn - sampled)
    engine = [-rng.expovariate(1.0) for _ in mask]
    trainer = [e + rng.gauss(0.0, 1e-3) for e in engine]
    return {"trainer": trainer, "engine": engine, "mask": mask, "starts": starts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=20000, help="response tokens per rollout")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--out", default=str(REPO / "build" / "bench"))
    args = ap.parse_args()
    import torch

    options = NumericsOptions()
    rng = random.Random(0)
    shapes = {"per-turn": lambda turns: 200 * turns, "split": lambda turns: args.tokens}
    rows = []
    for shape, tokens_of in shapes.items():
        for turns in TURNS:
            rows.append(measure(shape, turns, tokens_of(turns), options, rng, args.runs, torch))
    flat = {
        shape: [r for r in rows if r["shape"] == shape][-1]["us_per_token"]["summarize"]
        / [r for r in rows if r["shape"] == shape][0]["us_per_token"]["summarize"]
        for shape in shapes
    }
    lines = [
        f"numerics view cost per token ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.1f} at the end); after a {PROMPT}-token prompt",
        "",
        "| shape | turns | response tokens | summarize µs/token | + record line µs/token | floor µs/token "
        "| torch µs/token | summarize / floor | line bytes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        p = row["us_per_token"]
        lines.append(
            f"| {row['shape']} | {row['turns']} | {row['tokens']} | {p['summarize']:.3f} | {p['record']:.3f} | "
            f"{p['floor']:.3f} | {p['torch']:.4f} | {row['summarize_over_floor']:.2f}x | {row['line_bytes']} |"
        )
    lines.append("")
    for shape, ratio in flat.items():
        first, last = [r for r in rows if r["shape"] == shape][:: len(TURNS) - 1]
        against = last["summarize_over_floor"] / first["summarize_over_floor"]
        lines.append(
            f"flat ({shape}): per-token cost at {TURNS[-1]} turns / at {TURNS[0]} turns = {ratio:.2f}x; "
            f"against the floor of the same rollout: {against:.2f}x"
        )
    split = [r for r in rows if r["shape"] == "split"]
    per_turn_us = (
        (split[-1]["us_per_token"]["summarize"] - split[0]["us_per_token"]["summarize"])
        * args.tokens
        / (TURNS[-1] - TURNS[0])
    )
    lines.append(f"each turn's own summary (split, {TURNS[0]} to {TURNS[-1]} turns): {per_turn_us:.1f} µs a turn")
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "numerics_cost.md").write_text(text + "\n")
    (out / "numerics_cost.json").write_text(
        json.dumps({"rows": rows, "flat": flat, "us_per_turn": per_turn_us}, indent=1) + "\n"
    )


def measure(shape: str, turns: int, tokens: int, options: NumericsOptions, rng: random.Random, runs: int, torch):
    r = rollout(turns, tokens, rng)
    t, e, m, starts = r["trainer"], r["engine"], r["mask"], r["starts"]
    tt, te, tm = torch.tensor([t]), torch.tensor([e]), torch.tensor([m], dtype=torch.float32)

    def summarize():
        return summarize_rollout("r", t, e, m, PROMPT, starts, options, "old_log_prob", step=1)

    def record():
        return to_json_line(numerics_record(summarize(), options))

    def floor():
        return sum(abs(a - b) for a, b, k in zip(t, e, m, strict=True) if k) / sum(m)

    def torch_mean():
        return float(((tt - te).abs() * tm).sum() / tm.sum())

    got = summarize()
    assert abs(got.overall.mean_abs - floor()) < 1e-12 and len(got.by_turn) == turns  # the same figure
    times = fastest({"summarize": summarize, "record": record, "floor": floor, "torch": torch_mean}, runs, freeze=True)
    per = {k: 1e6 * wall / len(m) for k, (wall, _) in times.items()}
    return {
        "shape": shape,
        "turns": turns,
        "tokens": len(m),
        "trained": sum(m),
        "us_per_token": per,
        "summarize_over_floor": per["summarize"] / per["floor"],
        "line_bytes": len(record()),
    }


if __name__ == "__main__":
    main()
