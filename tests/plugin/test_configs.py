"""verl_ext's Hydra config group composed with verl's real ppo_trainer config, and the driver-side preflight."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from loop_harness import REPO, verl_config
from omegaconf import OmegaConf

from verl_ext.configs import CONFIG_DIR, PRESETS
from verl_ext.plugin.options import _KNOWN, LoopOptions, OptionsError
from verl_ext.plugin.preflight import PreflightError, check_config

LOOP_KEY = "actor_rollout_ref.rollout.agent.default_agent_loop"


@pytest.mark.parametrize(
    ("preset", "loop", "mode"),
    [("warn", "verl_ext_tool_agent", "warn"), ("strict", "verl_ext_tool_agent", "strict"),
     ("audit", "verl_ext_audited_tool_agent", "warn")],
)  # fmt: skip
def test_presets_compose_with_verls_ppo_trainer_from_the_command_line(preset, loop, mode):
    # no hydra.searchpath override: the installed plugin (hydra_plugins/verl_ext_searchpath) puts the group there
    cfg = verl_config([f"+verl_ext={preset}", "verl_ext.records.dir=/tmp/records"])  # then options without a `+`
    assert OmegaConf.select(cfg, LOOP_KEY) == loop
    assert cfg.verl_ext.check.mode == mode and cfg.verl_ext.records.dir == "/tmp/records"
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True
    assert cfg.trainer.total_epochs is not None  # verl's own config is all there
    assert check_config(cfg)[0].startswith(f"verl_ext: options checked before Ray starts: loop {loop}, check {mode}")


def test_the_documented_searchpath_override_selects_the_group_too():
    cfg = verl_config(["hydra.searchpath=[pkg://verl_ext.configs]", "+verl_ext=strict"])
    assert cfg.verl_ext.check.mode == "strict"


def test_an_unknown_preset_is_refused_by_hydra_with_the_available_ones():
    from hydra.errors import ConfigCompositionException

    available = r"(?s)Available options in 'verl_ext':\s+audit\s+strict\s+warn"
    with pytest.raises(ConfigCompositionException, match=available):
        verl_config(["+verl_ext=verl_ext"])  # used to be accepted as a string and change nothing


def test_the_warn_preset_lists_every_option():
    options = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "verl_ext" / "warn.yaml"))["verl_ext"]
    assert set(options) == _KNOWN[""]
    for section in ("check", "records"):
        assert set(options[section]) == _KNOWN[section]
    assert LoopOptions.from_mapping(options) == LoopOptions()  # and each at the default the dataclasses define
    assert sorted(p.stem for p in (CONFIG_DIR / "verl_ext").glob("*.yaml")) == sorted(PRESETS)


def test_a_string_where_the_options_belong_says_how_to_get_the_group():
    cfg = OmegaConf.create({"verl_ext": "strict", "actor_rollout_ref": {"rollout": {"agent": {
        "default_agent_loop": "verl_ext_tool_agent", "agent_loop_config_path": None}}}})  # fmt: skip
    with pytest.raises(OptionsError, match=r"hydra.searchpath=\[pkg://verl_ext.configs\]"):
        check_config(cfg)


def write_rows(path: Path, agent_name: str, n: int = 3) -> Path:
    import pandas as pd

    from verl_ext.demo.data import make_rows

    pd.DataFrame([{**row, "agent_name": agent_name} for row in make_rows(n, "train")]).to_parquet(path)
    return path


def test_rows_naming_tool_agent_are_announced_as_switched(tmp_path):
    train = write_rows(tmp_path / "train.parquet", "tool_agent")
    cfg = verl_config(["+verl_ext=warn", f"data.train_files={train}"])
    lines = check_config(cfg)
    assert any("3 rows naming tool_agent in the agent_name column run verl_ext_tool_agent" in line for line in lines)


def test_rows_naming_another_loop_are_announced_as_bypassing(tmp_path):
    train = write_rows(tmp_path / "train.parquet", "single_turn_agent")
    lines = check_config(verl_config(["+verl_ext=warn", f"data.train_files={train}"]))
    assert any("WARNING" in line and "3 rows naming single_turn_agent" in line for line in lines), lines


def test_stop_mode_refuses_the_dataset_before_ray_starts(tmp_path):
    train = write_rows(tmp_path / "train.parquet", "tool_agent")
    cfg = verl_config(["+verl_ext=strict", "verl_ext.agent_name_column=stop", f"data.train_files={train}"])
    named = r"data.train_files .*train.parquet \(3 rows\) has agent_name='tool_agent'"
    with pytest.raises(PreflightError, match=named):
        check_config(cfg)


def test_options_of_a_loop_entry_in_agent_loop_config_path_are_checked(tmp_path):
    loops = tmp_path / "loops.yaml"
    loops.write_text(
        "- name: my_loop\n  _target_: verl_ext.plugin.agent_loop.VerlExtToolAgentLoop\n  verl_ext:\n"
        "    check: {mode: loud}\n"
    )
    cfg = verl_config([f"{LOOP_KEY}=my_loop", f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}"])
    with pytest.raises(OptionsError, match="mode"):
        check_config(cfg)


def test_nothing_is_said_when_verl_ext_is_not_used():
    assert check_config(verl_config([f"{LOOP_KEY}=tool_agent"])) == []


def test_a_misspelled_option_stops_main_ppo_in_the_driver_with_the_error_last():
    # verl's real entry point; the preflight runs inside validate_config, before ray.init
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", "+verl_ext=strict", "+verl_ext.chek.mode=warn"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].strip().startswith("unknown option verl_ext.chek; known keys")
    assert "Traceback" not in out.stderr and "ray init" not in out.stdout


def test_the_built_wheel_ships_the_group_and_the_search_path_plugin(tmp_path):
    import shutil
    import zipfile

    src = tmp_path / "src"  # built from a copy: an in-tree build leaves build/ and egg-info beside the checkout
    for package in ("verl_ext", "hydra_plugins"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(REPO / name, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."]
    subprocess.run(cmd, cwd=src, check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("verl_ext-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    presets = {f"verl_ext/configs/verl_ext/{p}.yaml" for p in PRESETS}
    shipped = {"verl_ext/configs/agent_loops.yaml", "verl_ext/configs/cpu_demo.yaml"}
    assert presets | shipped | {"hydra_plugins/verl_ext_searchpath/__init__.py"} <= names
