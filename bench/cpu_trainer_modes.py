"""verl's trainers with a separate rollout pool on CPU, with verl_ext_tool_agent: ``one_step_off_policy`` or
``fully_async_policy``, weights over verl_ext's gloo checkpoint engine (verl's ``nccl`` one needs CUDA).

One short run of the demo's job (``configs/cpu_demo.yaml``: the tiny random Qwen3, the calculator dataset, the CPU
engine forcing a tool call as each rollout's first turn) under the chosen trainer's entry point and config keys
(``OVERRIDES``), then a summary from the trainer's log and verl_ext's records: wall time, steps, weight syncs,
rollouts checked and engine-view failures, and each rollout's ``trainer`` entry (served label, lag, problem) by
step. Minutes on a 2-core machine (Ray, FSDP2 and two pools start), so it is a command, not a CI test::

    .venv/bin/python bench/cpu_trainer_modes.py --trainer one-step-off --steps 3 --out build/one-step-off
    .venv/bin/python bench/cpu_trainer_modes.py --trainer fully-async --steps 2 --out build/fully-async

Exit status: the trainer's (the summary still prints what was written).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

from verl_ext.demo.run import prepare, trainer_command
from verl_ext.engines.forced_turn import FORCED_TOOL_CALL
from verl_ext.engines.gloo_checkpoint import GLOO_BACKEND, MODULE

# every trainer here: a rollout pool of its own (a fake GPU each for Ray), the gloo checkpoint engine, the
# rollout's logprobs trained on (bypass mode, as both trainers' own configs set it)
SEPARATE_POOL = (
    "trainer.use_v1=false",  # both are legacy-trainer (DataProto) subclasses
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    f"actor_rollout_ref.rollout.checkpoint_engine.backend={GLOO_BACKEND}",
    f"actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module={MODULE}",
    "algorithm.rollout_correction.bypass_mode=true",
    "ray_kwargs.ray_init.num_gpus=2",
    "+rollout.nnodes=1",
    "+rollout.n_gpus_per_node=1",
)
TRAINERS = {
    "one-step-off": "verl.experimental.one_step_off_policy.main_ppo",
    "fully-async": "verl.experimental.fully_async_policy.fully_async_main",
}
# what each trainer's own config file adds to ppo_trainer (one_step_off_ppo_trainer.yaml,
# fully_async_ppo_trainer.yaml), as overrides of the demo's job
OVERRIDES = {
    "one-step-off": ("actor_rollout_ref.rollout.free_cache_engine=false",),
    "fully-async": (
        "data.train_batch_size=0",  # the rollouter feeds one prompt at a time (gen_batch_size 1)
        "+data.gen_batch_size=1",
        "+rollout.n=2",
        "+rollout.total_rollout_steps=8",
        "+actor_rollout_ref.actor.use_rollout_log_probs=true",
        "+async_training.staleness_threshold=0.1",
        "+async_training.trigger_parameter_sync_step=1",
        "+async_training.require_batches=1",
        "+async_training.partial_rollout=true",
        "+async_training.use_trainer_do_validate=false",
        "+async_training.use_dynamic_resource_scheduling=false",
        "+async_training.dynamic_schedule_policy=default",
        "+async_training.dynamic_schedule_deactivate_ratio=0.3",
        "+async_training.dynamic_schedule_enable_rebalance=true",
        "+async_training.concurrent_samples_per_replica=4",
    ),
}
_SYNC = re.compile(r"weight sync \d+ \(global_steps=(\d+)\): loaded (\d+) tensors")
_STEP = re.compile(r"step:(\d+) - ")


def command(trainer: str, out: Path, steps: int) -> list[str]:
    """The trainer's command line: the demo's, with the trainer's entry point and keys."""
    paths = prepare(out, print)
    cmd = trainer_command(paths, out, steps, "v0", [*SEPARATE_POOL, *OVERRIDES[trainer]])
    cmd[2] = TRAINERS[trainer]  # python -m <module>
    return cmd


def summary(out: Path, log: str, seconds: float) -> dict:
    lines = [
        json.loads(x) for f in sorted((out / "records").glob("rollouts*.jsonl")) for x in f.read_text().split("\n") if x
    ]
    rollouts = [r for r in lines if r.get("type") == "rollout"]
    entries = Counter(
        (
            r["step"],
            (r.get("trainer") or {}).get("served"),
            (r.get("trainer") or {}).get("lag"),
            (r.get("trainer") or {}).get("problem"),
        )
        for r in rollouts
    )
    return {
        "wall_s": round(seconds, 1),
        "steps_logged": sorted({int(s) for s in _STEP.findall(log)}),
        "weight_syncs": [int(label) for label, _ in _SYNC.findall(log)],
        "rollouts": len(rollouts),
        "engine_view_failures": sum(not r["check"]["engine_ok"] for r in rollouts),
        "trainer_entries (step, served, lag, problem): count": {str(k): v for k, v in sorted(entries.items())},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trainer", choices=sorted(TRAINERS), required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in (out / "records").glob("*.jsonl"):
        old.unlink()
    env = {**os.environ, "VERL_PLATFORM": "cpu", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.setdefault("VERL_EXT_CPU_FORCE_FIRST_TURN", FORCED_TOOL_CALL)  # TEST/DEMO hook: a random model never calls
    started = time.monotonic()
    with (out / "train.log").open("w", encoding="utf-8") as fh:
        code = subprocess.run(command(args.trainer, out, args.steps), cwd=out, env=env, stdout=fh, stderr=fh).returncode
    log = (out / "train.log").read_text(encoding="utf-8", errors="replace")
    print(
        json.dumps(
            {"trainer": args.trainer, "returncode": code, **summary(out, log, time.monotonic() - started)}, indent=1
        )
    )
    return code


if __name__ == "__main__":
    raise SystemExit(main())
