"""verl's GRPO trainer with verl_ext and the real SGLang server on a GPU, against verl's stock tool_agent + stock
SGLang server on the same setup. A tiny random Qwen3 model is built locally (the real Qwen3 tokenizer, no download);
the first assistant turn is not forced: rollouts are multi-turn only when the model calls the tool, so a run with
``--min-turns`` > 1 needs a model that does (``--model``).

    python tests/gpu/run_sglang_grpo.py --out build/gpu [--steps 3] [--model DIR]

Prints, per arm: engine-view failures (verl_ext arm; must be 0), rollout-vs-trainer logprob difference
(``training/rollout_probs_diff_max``), generation time per step and rollout throughput (response tokens / s), and
the ratio verl_ext / stock measured in the same run. Writes ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from verl_ext.demo.data import write_dataset  # noqa: E402
from verl_ext.demo.model import build_tiny_qwen3  # noqa: E402
from verl_ext.demo.run import parse_step_line, shipped_tokenizers  # noqa: E402

ROLLOUTS_PER_STEP = 16 * 4  # data.train_batch_size * rollout.n below
ARMS = {
    "verl_ext": {"loop": "verl_ext_tool_agent", "server": "1"},
    "stock": {"loop": "tool_agent", "server": "0"},
}


def command(model: Path, data: dict[str, Path], out: Path, steps: int, loop: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        f"data.train_files={data['train']}",
        f"data.val_files={data['val']}",
        "data.train_batch_size=16",
        "data.max_prompt_length=512",
        "data.max_response_length=256",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.rollout.name=sglang",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.rollout.load_format=auto",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.prompt_length=512",
        "actor_rollout_ref.rollout.response_length=256",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        f"actor_rollout_ref.rollout.multi_turn.function_tool_path={REPO / 'verl_ext' / 'demo' / 'tools.py'}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={loop}",
        "actor_rollout_ref.rollout.agent.num_workers=2",
        f"reward.custom_reward_function.path={REPO / 'verl_ext' / 'demo' / 'reward.py'}",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.logger=[console]",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={out / 'ckpt'}",
        f"+verl_ext.records.dir={out / 'records'}",
        f"hydra.run.dir={out / 'hydra'}",
    ]


def run_arm(name: str, model: Path, data: dict[str, Path], out: Path, steps: int) -> dict[str, Any]:
    arm = ARMS[name]
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VERL_EXT_SGLANG_SERVER": arm["server"], "HF_HUB_OFFLINE": "1"}
    log = out / "train.log"
    steps_seen: dict[int, dict[str, float]] = {}
    with log.open("w") as fh:
        proc = subprocess.Popen(
            command(model, data, out, steps, arm["loop"]),
            env=env,
            cwd=out,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            parsed = parse_step_line(line)
            if parsed:
                steps_seen[parsed[0]] = parsed[1]
                print(f"[{name}] step {parsed[0]}: gen {parsed[1].get('timing_s/gen', float('nan')):.2f}s", flush=True)
        rc = proc.wait()
    if rc != 0:
        raise SystemExit(f"{name} arm failed (exit {rc}); see {log}")
    later = [m for s, m in sorted(steps_seen.items()) if s > 1] or list(steps_seen.values())  # step 1 warms up
    gen = sum(m.get("timing_s/gen", 0.0) for m in later)
    tokens = sum(m.get("response_length/mean", 0.0) * ROLLOUTS_PER_STEP for m in later)
    return {
        "steps": len(steps_seen),
        "engine_view_failures": sum(m.get("tito/engine_view_failures", 0.0) for m in steps_seen.values()),
        "rollout_probs_diff_max": max(m.get("training/rollout_probs_diff_max", float("nan")) for m in later),
        "gen_seconds_per_step": gen / max(len(later), 1),
        "response_tokens_per_second": tokens / gen if gen else float("nan"),
        "num_turns_mean": sum(m.get("num_turns/mean", 0.0) for m in later) / max(len(later), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "build" / "gpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--model", type=Path, default=None, help="a local model folder (default: tiny random Qwen3)")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    model = args.model or out / "tiny-qwen3"
    if args.model is None and not (model / "config.json").is_file():
        from transformers import AutoTokenizer

        build_tiny_qwen3(model, AutoTokenizer.from_pretrained(str(shipped_tokenizers()["qwen3"])), seed=0)
    data = write_dataset(out / "data")
    summary = {name: run_arm(name, model, data, out / name, args.steps) for name in ARMS}
    ours, stock = summary["verl_ext"], summary["stock"]
    summary["throughput_ratio_verl_ext_over_stock"] = (
        ours["response_tokens_per_second"] / stock["response_tokens_per_second"]
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0 if ours["engine_view_failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
