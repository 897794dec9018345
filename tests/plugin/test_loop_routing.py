"""Rows whose ``agent_name`` column names another loop cannot bypass verl_ext unseen: verl's own AgentLoopWorker,
in process, on dataset rows as verl's tool-agent preprocessing writes them (``agent_name: tool_agent``), loaded by
verl's RLHFDataset, against the CPU engine."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from loop_harness import DEMO_TOOLS, RecordingServer, load_tools, verl_config

from verl_ext.plugin import metrics_sink

TOOL_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call><|im_end|>'


def write_rows(path: Path, agent_names: list[str]) -> Path:
    """Rows as verl's examples/data_preprocess/gsm8k_multiturn_w_tool.py and its tool-agent recipes write them."""
    import pandas as pd

    from verl_ext.demo.data import make_rows

    rows = make_rows(len(agent_names), "train")
    for row, name in zip(rows, agent_names, strict=True):
        row["agent_name"] = name
    pd.DataFrame(rows).to_parquet(path)
    return path


def run_worker(tiny_qwen3_dir: Path, parquet: Path, overrides: list[str]) -> tuple[Any, RecordingServer]:
    """verl's AgentLoopWorker (the v0 worker; v1's AgentLoopWorkerTQ inherits _run_agent_loop) on one batch."""
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from verl_ext.engines.cpu import CPUGenerationServer

    config = verl_config(
        [
            f"actor_rollout_ref.model.path={tiny_qwen3_dir}",
            "actor_rollout_ref.rollout.name=verl_ext_cpu",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.format=hermes",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
            "actor_rollout_ref.rollout.prompt_length=512",
            "actor_rollout_ref.rollout.response_length=64",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            "data.max_prompt_length=512",
            *overrides,
        ]
    )
    server = RecordingServer(
        CPUGenerationServer(str(tiny_qwen3_dir), prompt_length=512, response_length=64, force_text=TOOL_CALL)
    )
    worker = AgentLoopWorker(config, server)
    worker.tools = load_tools(DEMO_TOOLS)  # verl registers a function tool once per process: share the harness's
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))
    dataset = RLHFDataset(data_files=[str(parquet)], tokenizer=tokenizer, config=config.data)
    batch = DataProto.from_single_dict(next(iter(DataLoader(dataset, batch_size=len(dataset), collate_fn=collate_fn))))
    batch.meta_info["global_steps"] = 1
    return asyncio.run(worker.generate_sequences(batch)), server


def test_rows_naming_the_stock_tool_agent_run_verl_ext_by_default(tiny_qwen3_dir, tmp_path):
    metrics_sink.drain()
    parquet = write_rows(tmp_path / "train.parquet", ["tool_agent", "tool_agent"])
    out, server = run_worker(
        tiny_qwen3_dir, parquet, ["actor_rollout_ref.rollout.agent.default_agent_loop=verl_ext_tool_agent"]
    )
    assert list(out.non_tensor_batch["agent_name"]) == ["tool_agent", "tool_agent"]  # the column said so ...
    assert all(v["engine_ok"] for v in out.non_tensor_batch["verl_ext_check"])  # ... and verl_ext ran them
    assert all("max_tokens" in r["sampling_params"] for r in server.requests)  # verl_ext's per-turn budget
    m = metrics_sink.drain()
    assert m["tito/loop/verl_ext_tool_agent"] == 2 and m["tito/loop/switched"] == 2
    assert "tito/loop/bypassed" not in m and m["tito/rollouts_checked"] == 2


def test_bypassing_rows_are_counted_and_warned_once_per_step(tiny_qwen3_dir, tmp_path, caplog):
    from verl.utils.tracking import Tracking

    metrics_sink.drain()
    parquet = write_rows(tmp_path / "train.parquet", ["tool_agent", "verl_ext_tool_agent", "single_turn_agent"])
    overrides = [
        "actor_rollout_ref.rollout.agent.default_agent_loop=verl_ext_tool_agent",
        "+verl_ext.agent_name_column=keep",
    ]
    out, _ = run_worker(tiny_qwen3_dir, parquet, overrides)
    checked = [v is not None and "engine_ok" in v for v in out.non_tensor_batch["verl_ext_check"]]
    assert checked == [False, True, False]  # only the row naming verl_ext's loop ran it

    tracker = Tracking(project_name="p", experiment_name="e", default_backend=["console"])
    with caplog.at_level(logging.WARNING, logger="verl_ext.plugin"):
        tracker.log({"step_metric": 1.0}, step=7)
        tracker.log({"step_metric": 1.0}, step=8)  # nothing ran since: no second warning
    warnings = [r.getMessage() for r in caplog.records if "bypassed verl_ext" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "step 7: 2 of 3 rollouts" in warnings[0] and "single_turn_agent 1, tool_agent 1" in warnings[0]
    assert "`agent_name` column" in warnings[0]


def test_logged_step_metrics_say_which_loop_ran(tiny_qwen3_dir, tmp_path):
    metrics_sink.drain()
    parquet = write_rows(tmp_path / "train.parquet", ["tool_agent", "single_turn_agent"])
    run_worker(tiny_qwen3_dir, parquet, ["actor_rollout_ref.rollout.agent.default_agent_loop=verl_ext_tool_agent"])
    m = metrics_sink.drain()
    assert m["tito/loop/verl_ext_tool_agent"] == 1 and m["tito/loop/switched"] == 1
    assert m["tito/loop/single_turn_agent"] == 1 and m["tito/loop/bypassed"] == 1


def test_stop_mode_names_the_column_and_the_fix(tiny_qwen3_dir, tmp_path):
    from verl_ext.plugin.loop_routing import BypassError

    parquet = write_rows(tmp_path / "train.parquet", ["tool_agent"])
    overrides = [
        "actor_rollout_ref.rollout.agent.default_agent_loop=verl_ext_tool_agent",
        "+verl_ext.agent_name_column=stop",
    ]
    with pytest.raises(BypassError, match=r"agent_name='tool_agent'.*`agent_name` column overrides.*Fix: drop"):
        run_worker(tiny_qwen3_dir, parquet, overrides)


def test_nothing_changes_when_verl_ext_is_not_the_default_loop(tiny_qwen3_dir, tmp_path):
    metrics_sink.drain()
    parquet = write_rows(tmp_path / "train.parquet", ["tool_agent"])
    out, server = run_worker(tiny_qwen3_dir, parquet, ["actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent"])
    assert "verl_ext_check" not in out.non_tensor_batch
    assert not any(k.startswith("tito/loop/") for k in metrics_sink.drain())
