"""What the numerics view costs per training step, against the old-logprob pass on the same batch (goal: at most 2%).

One batch shaped as verl's v0 trainer holds it (``DataProto``: prompts left-padded, responses right-padded, the
engine's ``rollout_log_probs``, the loop's ``verl_ext_rollout_id`` / ``verl_ext_turn_starts`` / ``verl_ext_check``
columns), ``--rows`` rollouts of a ``--prompt``-token prompt and ``--response`` response positions in ``--turns``
engine calls (80% of each call sampled, mask 1; the rest tool context, mask 0). Timed, taking turns (each kept at
its fastest run, ``bench/_timing.py``):

- ``old_log_prob``: the trainer's recompute of the batch: the demo's tiny random Qwen3 (verl_ext/demo/model.py, the
  real Qwen3 vocabulary of 151,669 tokens, fp32, CPU) run forward one row at a time (the demo's
  ``log_prob_micro_batch_size_per_gpu=1``) with the logprob of each response token gathered from its log-softmax;
- ``numerics``: the view's real hooks on that batch and those logprobs: ``measure_v0`` (the v0 trainer's hook: rows
  read, summarized per rollout, handed to the collector), then the driver's step hook ``step_metrics`` (numerics
  record lines written, ``tito/numerics/*`` computed). Outside Ray the collector is this process's (in a run it is
  a named Ray actor: one round trip per batch more, not timed here).

Printed: both times, and numerics over old_log_prob (the figure docs/numerics.md quotes). The tiny model is the
cheapest trainer forward verl_ext runs (2 layers of width 64: almost all its time is the 151k-token head), so a real
model's pass makes the ratio smaller still.
Usage: ``python bench/numerics_step_cost.py [--rows 4] [--prompt 256] [--response 256] [--turns 4] [--runs 5]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _timing import fastest  # noqa: E402


def batch_of(rows: int, prompt: int, response: int, turns: int, vocab: int, rng: random.Random):
    """The v0 trainer's batch (module docstring) and the response-token ids, all rows full length."""
    import numpy as np
    import torch
    from verl import DataProto

    per_turn = response // turns
    mask_row: list[int] = []
    starts: list[int] = []
    for _ in range(turns):
        starts.append(len(mask_row))
        sampled = per_turn * 4 // 5
        mask_row += [1] * sampled + [0] * (per_turn - sampled)
    mask_row += [0] * (response - len(mask_row))
    ids = torch.tensor([[rng.randrange(vocab) for _ in range(prompt + response)] for _ in range(rows)])
    engine = torch.zeros(rows, response)  # replaced by the trainer's + float32-level noise once they exist (main)
    batch = DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "prompts": ids[:, :prompt],
            "responses": ids[:, prompt:],
            "attention_mask": torch.ones(rows, prompt + response, dtype=torch.long),
            "position_ids": torch.arange(prompt + response).repeat(rows, 1),
            "response_mask": torch.tensor([mask_row] * rows),
            "rollout_log_probs": engine,
        },
        non_tensors={
            "verl_ext_rollout_id": np.array([f"r{i}" for i in range(rows)], dtype=object),
            "verl_ext_turn_starts": np.array([starts] * rows + [None], dtype=object)[:-1],
            "verl_ext_check": np.array([{"ok": True, "engine_ok": True}] * rows, dtype=object),
        },
    )
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--response", type=int, default=256)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokenizer", default=str(REPO / "build" / "tokenizers" / "qwen3"))
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM
    from verl import DataProto

    from verl_ext.demo.model import build_tiny_qwen3
    from verl_ext.plugin import numerics_sink, numerics_step, numerics_trainer
    from verl_ext.plugin.numerics_trainer import NumericsSettings, measure_v0

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="numerics-step-cost-"))
    model = AutoModelForCausalLM.from_pretrained(str(build_tiny_qwen3(work / "tiny-qwen3", args.tokenizer))).eval()
    batch = batch_of(args.rows, args.prompt, args.response, args.turns, model.config.vocab_size, random.Random(0))
    ids = batch.batch["input_ids"]
    out: dict[str, torch.Tensor] = {}

    def old_log_prob() -> None:
        rows = []
        with torch.no_grad():
            for i in range(ids.shape[0]):  # one row a micro-batch, as the demo's trainer runs it
                logits = model(input_ids=ids[i : i + 1]).logits[0, args.prompt - 1 : -1]
                rows.append(torch.log_softmax(logits, -1).gather(-1, ids[i, args.prompt :, None])[:, 0])
        out["old_log_probs"] = torch.stack(rows)

    old_log_prob()
    # the engine's logprobs as a clean run reports them: the trainer's to float32 rounding (no drift to warn about)
    noise = torch.randn(out["old_log_probs"].shape, generator=torch.Generator().manual_seed(0)) * 1e-6
    batch.batch["rollout_log_probs"] = out["old_log_probs"] + noise
    logprobs = DataProto.from_dict(tensors={"old_log_probs": out["old_log_probs"]})
    numerics_trainer._settings = NumericsSettings(records_dir=str(work / "records"))
    trainer = SimpleNamespace(config={"verl_ext": {}}, global_steps=1)
    response_mask = batch.batch["response_mask"].clone()

    def numerics() -> None:
        batch.batch["response_mask"] = response_mask.clone()  # warn policy masks nothing; the same batch each run
        measure_v0(trainer, batch, logprobs)
        numerics_step.step_metrics(trainer.global_steps, checked=float(args.rows))
        trainer.global_steps += 1

    numerics_sink.drain()
    best = fastest({"old_log_prob": old_log_prob, "numerics": numerics}, args.runs)
    load = os.getloadavg()[0]
    t_pass, t_view = best["old_log_prob"][0], best["numerics"][0]
    trained = int(response_mask.sum())
    print(
        f"numerics view per step against the old-logprob pass ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, 1 torch thread, load {load:.1f} at the end); {args.rows} rollouts x "
        f"({args.prompt} prompt + {args.response} response tokens, {args.turns} turns, {trained} trained tokens)"
    )
    print(f"  old_log_prob (tiny Qwen3 forward + log-softmax gather): {t_pass * 1e3:9.2f} ms")
    print(f"  numerics (measure_v0 + step_metrics, records written):  {t_view * 1e3:9.2f} ms")
    print(f"  numerics / old_log_prob: {t_view / t_pass:.4f} ({100 * t_view / t_pass:.2f}%; goal at most 2%)")


if __name__ == "__main__":
    main()
