"""Rows whose ``agent_name`` column names another loop cannot bypass verl_ext unseen: verl's own AgentLoopWorker,
in process, on dataset rows as verl's tool-agent preprocessing writes them (``agent_name: tool_agent``), loaded by
verl's RLHFDataset, against the CPU engine."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from loop_harness import DEMO_TOOLS, RecordingServer, load_tools, verl_config

from verl_ext.plugin import metrics_sink

LOOP_KEY = "actor_rollout_ref.rollout.agent.default_agent_loop"
TOOL_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call><|im_end|>'


ROWS = ["tool_agent", "verl_ext_tool_agent", "single_turn_agent", "tool_agent"]


@dataclass
class Worker:
    """verl's AgentLoopWorker (the v0 worker; v1's AgentLoopWorkerTQ inherits _run_agent_loop) in process, with the
    CPU engine, and a batch of dataset rows loaded by verl's RLHFDataset: built once for this module."""

    worker: Any
    server: RecordingServer
    base_config: Any
    batch: Any
    event_loop: asyncio.AbstractEventLoop  # one for the module: the engine's lock binds to the first it runs on

    def run(self, rows: list[int], overrides: dict[str, Any]) -> Any:
        from omegaconf import OmegaConf

        config = copy.deepcopy(self.base_config)
        for key, value in overrides.items():
            OmegaConf.update(config, key, value, force_add=True)
        self.worker.config = config  # what _run_agent_loop and the loops read per rollout
        self.worker.__dict__.pop("_verl_ext_router", None)
        self.server.requests.clear()
        batch = self.batch.select_idxs(rows)
        batch.meta_info["global_steps"] = 1
        return self.event_loop.run_until_complete(self.worker.generate_sequences(batch))


@pytest.fixture(scope="module")
def worker(tiny_qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    import pandas as pd
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from verl_ext.demo.data import make_rows
    from verl_ext.engines.cpu import CPUGenerationServer

    # rows as verl's examples/data_preprocess/gsm8k_multiturn_w_tool.py and its tool-agent recipes write them
    rows = make_rows(len(ROWS), "train")
    for row, name in zip(rows, ROWS, strict=True):
        row["agent_name"] = name
    parquet = tmp_path_factory.mktemp("rows") / "train.parquet"
    pd.DataFrame(rows).to_parquet(parquet)

    config = verl_config(
        [
            f"actor_rollout_ref.model.path={tiny_qwen3_dir}",
            "actor_rollout_ref.rollout.name=verl_ext_cpu",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.format=hermes",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
            "actor_rollout_ref.rollout.prompt_length=512",
            "actor_rollout_ref.rollout.response_length=48",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            f"{LOOP_KEY}=verl_ext_tool_agent",
            "data.max_prompt_length=512",
        ]
    )
    server = RecordingServer(
        CPUGenerationServer(str(tiny_qwen3_dir), prompt_length=512, response_length=48, force_text=TOOL_CALL)
    )
    agent_worker = AgentLoopWorker(config, server)
    agent_worker.tools = load_tools(DEMO_TOOLS)  # verl registers a function tool once per process: the harness's
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))
    dataset = RLHFDataset(data_files=[str(parquet)], tokenizer=tokenizer, config=config.data)
    batch = DataProto.from_single_dict(next(iter(DataLoader(dataset, batch_size=len(ROWS), collate_fn=collate_fn))))
    assert list(batch.non_tensor_batch["agent_name"]) == ROWS  # verl's dataset carries the column through
    event_loop = asyncio.new_event_loop()
    yield Worker(agent_worker, server, config, batch, event_loop)
    event_loop.close()


def checked(out: Any) -> list[bool]:
    """Per rollout: did a verl_ext loop run it (its verdict is in the batch)?"""
    column = out.non_tensor_batch.get("verl_ext_check")
    return [v is not None and "engine_ok" in v for v in column] if column is not None else [False] * len(out)


def test_rows_naming_the_stock_tool_agent_run_verl_ext_by_default(worker):
    metrics_sink.drain()
    out = worker.run([0, 3], {})
    assert list(out.non_tensor_batch["agent_name"]) == ["tool_agent", "tool_agent"]  # the column said so ...
    assert checked(out) == [True, True]  # ... and verl_ext's loop ran them
    assert all(v["engine_ok"] for v in out.non_tensor_batch["verl_ext_check"])
    m = metrics_sink.drain()
    assert m["tito/loop/verl_ext_tool_agent"] == 2 and m["tito/loop/switched"] == 2
    assert "tito/loop/bypassed" not in m and m["tito/rollouts_checked"] == 2


def test_bypassing_rows_are_counted_and_warned_once_per_step(worker, caplog):
    from verl.utils.tracking import Tracking

    metrics_sink.drain()
    out = worker.run([0, 1, 2], {})
    assert checked(out) == [True, True, False]  # tool_agent switched, verl_ext's own, single_turn_agent bypassed

    tracker = Tracking(project_name="p", experiment_name="e", default_backend=["console"])
    with caplog.at_level(logging.WARNING, logger="verl_ext.plugin"):
        tracker.log({"step_metric": 1.0}, step=7)  # drains tito/ into the step's metrics, as in training
        tracker.log({"step_metric": 1.0}, step=8)  # nothing ran since: no second warning
    warnings = [r.getMessage() for r in caplog.records if "bypassed verl_ext" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "step 7: 1 of 3 rollouts" in warnings[0] and "single_turn_agent 1, verl_ext_tool_agent 2" in warnings[0]
    assert "`agent_name` column" in warnings[0]


def test_keep_lets_rows_run_the_loop_they_name_and_counts_them(worker):
    metrics_sink.drain()
    out = worker.run([0], {"verl_ext.agent_name_column": "keep"})
    assert checked(out) == [False]
    m = metrics_sink.drain()
    assert m == {"tito/loop/tool_agent": 1.0, "tito/loop/bypassed": 1.0}  # shown even with no check result


def test_stop_mode_names_the_column_and_the_fix(worker):
    from verl_ext.plugin.loop_routing import BypassError

    with pytest.raises(BypassError, match=r"agent_name='tool_agent'.*`agent_name` column overrides.*Fix: drop"):
        worker.run([0], {"verl_ext.agent_name_column": "stop"})


def test_nothing_changes_when_verl_ext_is_not_the_default_loop(worker):
    metrics_sink.drain()
    out = worker.run([0], {LOOP_KEY: "tool_agent", "verl_ext.agent_name_column": "stop"})
    assert checked(out) == [False]
    assert not any(k.startswith("tito/loop/") for k in metrics_sink.drain())
