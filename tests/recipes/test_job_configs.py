"""configs/: the user-facing job configs (the GRPO + SGLang job, the CPU demo job), each composed with Hydra against
verl's real trainer config and the packaged ``verl_ext`` group, checked by verl_ext's preflight, and composed by
verl's own entry point as recipes/gsm8k_qwen3_sglang/job.sh runs it (``--config-dir configs``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from verl_ext.configs import CONFIG_DIR
from verl_ext.plugin.preflight import PreflightError, check_config

pytestmark = pytest.mark.xdist_group("ray")  # the Ray group: tests/conftest.py

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "configs"
PATHS = {  # what submit.sh / `verl-ext demo` fill in
    "grpo_qwen3_sglang": ["actor_rollout_ref.model.path=/models/Qwen3-4B", "data.train_files=/data/train.parquet"],
    "cpu_demo": ["actor_rollout_ref.model.path=/models/tiny", "data.train_files=/data/train.parquet"],
}


def compose_job(name: str, overrides: list[str] = ()) -> Any:
    """The job config as ``python -m verl.trainer.main_ppo --config-path configs --config-name NAME`` composes it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(JOBS), version_base=None):
        return compose(config_name=name, overrides=[*PATHS[name], *overrides])


def test_the_folder_holds_the_two_jobs():
    assert sorted(p.stem for p in JOBS.glob("*.yaml")) == sorted(PATHS)


@pytest.mark.parametrize("name", sorted(PATHS))
def test_a_job_composes_verls_trainer_config_with_the_verl_ext_group(name: str, tmp_path: Path):
    raw = yaml.safe_load((JOBS / f"{name}.yaml").read_text())
    assert {"ppo_trainer", "_self_"} <= set(map(str, raw["defaults"])) and {"verl_ext": "warn"} in raw["defaults"]
    assert "verl_ext" not in raw  # the options are defined in the packaged group only; a job selects a preset
    cfg = compose_job(name, [f"verl_ext.records.dir={tmp_path / 'records'}"])
    preset = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "verl_ext" / "warn.yaml"))
    expected = {**preset["verl_ext"], "records": {**preset["verl_ext"]["records"], "dir": str(tmp_path / "records")}}
    assert OmegaConf.to_container(cfg.verl_ext) == expected
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.agent.default_agent_loop == "verl_ext_tool_agent"
    assert rollout.multi_turn.enable and rollout.calculate_log_probs and rollout.multi_turn.format == "hermes"
    assert cfg.trainer.total_epochs is not None and cfg.critic is not None  # verl's own config is all there
    line = check_config(cfg)[0]
    assert line.startswith("verl_ext: options checked before Ray starts: loop verl_ext_tool_agent, check warn"), line


def test_the_grpo_job_switches_on_the_token_exact_sglang_server(monkeypatch: pytest.MonkeyPatch):
    from verl_ext.engines.sglang_output import SWITCH_ENV
    from verl_ext.plugin.loop_routing import server_enabled

    monkeypatch.delenv(SWITCH_ENV, raising=False)
    rollout = compose_job("grpo_qwen3_sglang").actor_rollout_ref.rollout
    assert rollout.name == "sglang" and rollout.skip_tokenizer_init and server_enabled(rollout)
    audit = compose_job("grpo_qwen3_sglang", ["verl_ext=audit"]).actor_rollout_ref.rollout
    assert audit.agent.default_agent_loop == "verl_ext_audited_tool_agent" and not server_enabled(audit)


def test_a_job_option_is_still_checked_by_the_preflight(tmp_path: Path):
    (tmp_path / "file").write_text("")
    cfg = compose_job("grpo_qwen3_sglang", [f"verl_ext.records.dir={tmp_path / 'file' / 'r'}"])
    with pytest.raises(PreflightError, match="verl_ext.records.dir=.*cannot be created"):
        check_config(cfg)


def test_main_ppo_composes_the_grpo_job_from_the_config_dir_as_job_sh_runs_it(tmp_path: Path):
    # the same command line as recipes/gsm8k_qwen3_sglang/job.sh, from the checkout (Ray's working_dir in a job);
    # a records folder that cannot be created stops it in the driver, after the whole config composed
    (tmp_path / "file").write_text("")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", "--config-dir=configs", "--config-name=grpo_qwen3_sglang",
           "actor_rollout_ref.rollout.multi_turn.function_tool_path=verl_ext/demo/tools.py",
           f"verl_ext.records.dir={tmp_path / 'file' / 'records'}"]  # fmt: skip
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.strip().splitlines()[-1].strip().startswith("verl_ext.records.dir="), out.stderr[-2000:]
    assert "Traceback" not in out.stderr
