"""recipes/async without a cluster: what each script submits is read back (a stand-in for ``python`` prints the
arguments it gets, so nothing reaches Ray), and the job's trainer config is composed from configs/ and checked by
verl_ext's preflight, as the job's driver would before training:

- submit.sh: the GSM8K SGLang job (recipes/gsm8k_qwen3_sglang/job.sh) under verl's ``colocate_async`` trainer mode;
- submit_cpu.sh: ``verl-ext demo --trainer colocate-async --loop all`` on the two-node CPU cluster (the job itself
  is the run of tests/demo/test_async_e2e.py: the same command, without the cluster)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from verl_ext.cli.main import build_parser
from verl_ext.demo.run import JOB_CONFIGS, trainer_command
from verl_ext.plugin.preflight import check_config

pytestmark = pytest.mark.xdist_group("ray")  # the Ray group: tests/conftest.py

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "async"


def submitted(tmp_path: Path, script: str, *args: str, **env: str) -> list[str]:
    """The entry point the script submits (the command Ray runs), with a ``python`` that prints its arguments."""
    standin = tmp_path / "python-standin"
    standin.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    standin.chmod(0o755)
    full_env = {**os.environ, "PYTHON": str(standin), "OUT": str(tmp_path / "out"), **env}
    out = subprocess.run([str(RECIPE / script), *args], env=full_env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    argv = json.loads(out.stdout)
    assert Path(argv[0]).resolve() == REPO / "recipes" / "ray_submit.py"
    sys.path.insert(0, str(REPO / "recipes"))
    try:
        from ray_submit import parse_args
    finally:
        sys.path.remove(str(REPO / "recipes"))
    return shlex.split(shlex.join(parse_args(argv[1:]).entrypoint))  # the job runs the joined line in a shell


def compose(name: str, overrides: list[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(JOB_CONFIGS), version_base=None):
        return hydra_compose(config_name=name, overrides=overrides)


def test_the_gpu_job_is_the_gsm8k_job_under_colocate_async(tmp_path: Path) -> None:
    env = {"RAY_ADDRESS": "http://head:8265", "MODEL": "/models/Qwen3-4B", "DATA": "/data/gsm8k", "WARMUP": "2"}
    entry = submitted(tmp_path, "submit.sh", "verl_ext.check.mode=strict", **env)
    assert entry[:2] == ["bash", "recipes/gsm8k_qwen3_sglang/job.sh"], entry
    model, data, records, nnodes, gpus, *trainer_args = entry[2:]
    assert (model, data, records, nnodes, gpus) == ("/models/Qwen3-4B", "/data/gsm8k", "", "2", "8")
    paths = [f"actor_rollout_ref.model.path={model}", f"data.train_files={data}/train.parquet"]
    cfg = compose("grpo_qwen3_sglang", [*paths, *trainer_args])
    assert cfg.trainer.v1.trainer_mode == "colocate_async" and cfg.trainer.use_v1
    assert cfg.trainer.v1.colocate_async.num_warmup_batches == 2 and cfg.verl_ext.check.mode == "strict"
    assert "engine_kwargs" not in trainer_args  # no CPU engine hook on a GPU job
    assert check_config(cfg)[0].startswith("verl_ext: options checked before Ray starts: loop verl_ext_tool_agent")


def test_the_cpu_job_is_the_async_demo_with_every_loop(tmp_path: Path) -> None:
    entry = submitted(tmp_path, "submit_cpu.sh", "trainer.save_freq=-1", STEPS="1")
    assert entry[:6] == ["verl-ext", "demo", "--trainer", "colocate-async", "--loop", "all"], entry
    demo = build_parser().parse_args(entry[1:])
    paths = {name: tmp_path / name for name in ("model", "train", "val")}
    command = trainer_command(paths, Path(demo.out), demo.steps, demo.trainer, demo.overrides, demo.loop)
    overrides = [a for a in command[command.index("--config-name=cpu_demo") + 1 :] if not a.startswith("hydra.")]
    cfg = compose("cpu_demo", overrides)
    assert cfg.trainer.v1.trainer_mode == "colocate_async" and cfg.trainer.total_training_steps == 1
    assert set(cfg.ray_kwargs.ray_init) & {"num_cpus", "num_gpus", "include_dashboard"} == set()  # joins the cluster
    own = cfg.actor_rollout_ref.rollout.engine_kwargs.verl_ext_cpu
    assert [dict(f) for f in own.faults] == [{"kind": "abort_after", "tokens": 4}]  # the demo's partial rollouts
    assert own.truth_log == str(Path(demo.out).resolve() / "engine-truth.jsonl") or own.truth_log.endswith(
        "engine-truth.jsonl"
    )
    assert cfg.verl_ext.harness.function == "verl_ext.demo.harness:run"  # the gateway rows' harness
