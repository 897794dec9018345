"""recipes/gsm8k_qwen3_sglang: its data preparation from a local file, and its YAML switching on verl_ext's loop
and, with it, verl_ext's SGLang server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "gsm8k_qwen3_sglang"


def test_prepare_data_from_a_local_jsonl(tmp_path: Path) -> None:
    import pandas as pd

    rows = [{"question": "Tom has 3 boxes of 12 eggs. How many eggs?", "answer": "3*12=<<3*12=36>>36\n#### 36"}]
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run = subprocess.run(
        [
            sys.executable,
            str(RECIPE / "prepare_data.py"),
            "--train",
            str(tmp_path / "train.jsonl"),
            "--test",
            str(tmp_path / "test.jsonl"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    df = pd.read_parquet(tmp_path / "out" / "train.parquet")
    row = df.iloc[0]
    assert row["data_source"] == "openai/gsm8k" and row["reward_model"]["ground_truth"] == "36"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]


def test_prepare_data_names_a_row_without_a_final_answer(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text(json.dumps({"question": "q"}) + "\n")
    run = subprocess.run(
        [
            sys.executable,
            str(RECIPE / "prepare_data.py"),
            "--train",
            str(tmp_path / "bad.jsonl"),
            "--test",
            str(tmp_path / "bad.jsonl"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "lacks ['answer']" in run.stderr


def test_recipe_yaml_switches_on_the_loop_and_the_sglang_server(monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra import compose, initialize_config_dir

    from verl_ext.engines.sglang_output import server_enabled

    monkeypatch.setenv("VERL_EXT_REPO", str(REPO))
    monkeypatch.delenv("VERL_EXT_SGLANG_SERVER", raising=False)
    with initialize_config_dir(config_dir=str(RECIPE), version_base=None):
        cfg = compose(config_name="grpo_qwen3_sglang")
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.name == "sglang" and rollout.agent.default_agent_loop == "verl_ext_tool_agent"
    assert rollout.skip_tokenizer_init and rollout.calculate_log_probs
    assert server_enabled(rollout)
    assert os.environ["VERL_EXT_REPO"] == str(REPO)
