"""recipes/agent_harness/submit.sh without a cluster: what it submits is read back (a stand-in for ``python`` prints the
arguments it gets, so nothing reaches Ray), then the job's entry point (``verl-ext demo --loop gateway``) is parsed
by the ``verl-ext`` parser, turned into verl's trainer command by the demo, and that command's config is composed by
Hydra from configs/ and checked by verl_ext's preflight, as the job's driver would before training. The job itself
is the run of tests/demo/test_gateway_demo.py (the same command, without the cluster)."""

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
from verl_ext.plugin.options import OptionsError
from verl_ext.plugin.preflight import check_config

pytestmark = pytest.mark.xdist_group("ray")  # the Ray group: tests/conftest.py

REPO = Path(__file__).resolve().parents[2]
SUBMIT = REPO / "recipes" / "agent_harness" / "submit.sh"


def submit(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run submit.sh with a ``python`` that prints its arguments as JSON instead of submitting."""
    standin = tmp_path / "python-standin"
    standin.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    standin.chmod(0o755)
    full_env = {**os.environ, "PYTHON": str(standin), "OUT": str(tmp_path / "out"), **env}
    return subprocess.run([str(SUBMIT), *args], env=full_env, capture_output=True, text=True, timeout=60)


def job_config(tmp_path: Path, *args: str, **env: str) -> tuple[Any, list[str]]:
    """The job's config as its driver composes it, and the job's entry point (the command Ray runs)."""
    sys.path.insert(0, str(REPO / "recipes"))
    try:
        from ray_submit import parse_args
    finally:
        sys.path.remove(str(REPO / "recipes"))
    out = submit(tmp_path, *args, **env)
    assert out.returncode == 0, out.stderr
    argv = json.loads(out.stdout)
    assert Path(argv[0]).resolve() == REPO / "recipes" / "ray_submit.py"
    args = parse_args(argv[1:])
    assert args.address == "http://127.0.0.1:28265"  # recipes/cpu_demo/cluster.sh's dashboard
    entry = shlex.split(shlex.join(args.entrypoint))  # the job runs the joined line in a shell
    assert entry[:4] == ["verl-ext", "demo", "--loop", "gateway"], entry
    demo = build_parser().parse_args(entry[1:])
    paths = {name: tmp_path / name for name in ("model", "train", "val")}
    command = trainer_command(paths, Path(demo.out), demo.steps, demo.trainer, demo.overrides, demo.loop)
    assert command[command.index("-m") + 1] == "verl.trainer.main_ppo"
    assert f"--config-path={JOB_CONFIGS}" in command and "--config-name=cpu_demo" in command
    overrides = [a for a in command[command.index("--config-name=cpu_demo") + 1 :] if not a.startswith("hydra.")]
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(JOB_CONFIGS), version_base=None):
        return compose(config_name="cpu_demo", overrides=overrides), entry


def test_the_job_runs_the_demos_harness_through_the_gateway_on_the_cluster(tmp_path: Path) -> None:
    cfg, entry = job_config(tmp_path)
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "verl_ext_gateway_agent"
    assert cfg.trainer.total_training_steps == 2 and cfg.trainer.device == "cpu"
    assert set(cfg.ray_kwargs.ray_init) & {"num_cpus", "num_gpus", "include_dashboard"} == set()  # joins the cluster
    lines = check_config(cfg)
    assert lines[0].startswith("verl_ext: options checked before Ray starts: loop verl_ext_gateway_agent, check warn")
    assert lines[1].startswith("verl_ext: verl_ext_gateway_agent runs the harness function verl_ext.demo.harness:run")


def test_a_harness_of_ones_own_and_trainer_options_reach_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"own_agent_{tmp_path.name}"  # a name no earlier test imported
    cfg, _ = job_config(tmp_path, "verl_ext.check.mode=strict", HARNESS=f"{module}:run", STEPS="1")
    assert cfg.verl_ext.harness.function == f"{module}:run" and cfg.trainer.total_training_steps == 1
    assert cfg.verl_ext.check.mode == "strict"
    with pytest.raises(OptionsError, match=rf"^verl_ext.harness.function={module}:run: cannot import {module} "):
        check_config(cfg)  # not on this driver's path: the job would stop here, before Ray starts
    (tmp_path / f"{module}.py").write_text("async def run(base_url, api_key, row):\n    return {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert f"runs the harness function {module}:run" in check_config(cfg)[1]
    command = f'{sys.executable} -m my_agent --name "calc agent"'
    cfg, _ = job_config(tmp_path, HARNESS_COMMAND=command)
    assert cfg.verl_ext.harness.function is None
    assert check_config(cfg)[1].startswith(f"verl_ext: verl_ext_gateway_agent runs the harness command {command!r}")


def test_a_command_with_a_single_quote_is_refused_before_submitting(tmp_path: Path) -> None:
    out = submit(tmp_path, HARNESS_COMMAND="python -c 'print(1)'")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == "submit.sh: HARNESS_COMMAND holds a single quote; use double quotes inside it"
