"""End to end through the gateway: ``verl-ext demo --loop gateway --trainer v0 --bypass`` runs verl's real GRPO trainer
(its legacy v0 trainer, which no other test starts: tests/demo/test_e2e.py runs v1; Ray, FSDP2 on gloo, the CPU
engine) with ``verl_ext_gateway_agent``, whose harness is the demo's ReAct calculator agent on the official openai SDK
(verl_ext/demo/harness.py): each row is a gateway session, the harness runs the calculator the model called, and the
session's branch is the row's training sample. The same start runs verl's bypass mode
(``algorithm.rollout_correction.bypass_mode``: no old-logprob pass), where the numerics view measures inside the
policy loss. One step of two rows x 2 samples in two mini-batches of one row: the second mini-batch comes after the
step's first update, so its rollouts are the ones counted unavailable (CI time: this is one trainer start; the
start, not the rollouts, is most of it)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from verl_ext.cli.main import main as cli
from verl_ext.demo.data import DATA_SOURCE
from verl_ext.demo.run import DemoResult, run_demo

pytestmark = [pytest.mark.timeout(1200), pytest.mark.xdist_group("ray")]  # demo beside a worker; Ray group
# two rows, a mini-batch (an optimizer update) per row
TWO_MINI_BATCHES = ("data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=1")
ROLLOUTS = 4  # 2 rows x rollout.n 2 (configs/cpu_demo.yaml)
MEASURED = 2  # the first mini-batch's: before the step's first update


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    lines: list[str] = []
    out = tmp_path_factory.mktemp("demo-gateway")
    result = run_demo(
        out, steps=1, trainer="v0", loop="gateway", bypass=True, extra_overrides=TWO_MINI_BATCHES, say=lines.append
    )
    assert result.returncode == 0, "\n".join(lines)
    return result


def records(result: DemoResult) -> list[dict[str, Any]]:
    return [json.loads(line) for f in (result.out / "records").glob("*.jsonl") for line in f.read_text().splitlines()]


def test_a_grpo_step_trains_on_the_harness_sessions(demo: DemoResult) -> None:
    assert sorted(demo.steps) == [1]
    m = demo.steps[1]
    assert m["actor/grad_norm"] > 0
    assert "training/rollout_probs_diff_max" not in m  # bypass mode: verl computes no old logprobs
    assert m["tito/loop/verl_ext_gateway_agent"] == ROLLOUTS and "tito/loop/verl_ext_tool_agent" not in m
    assert m["tito/rollouts_checked"] == ROLLOUTS and m["tito/engine_view_failures"] == 0
    assert m["tito/lost_sampled_tokens"] == 0 and m["tito/sampled_tokens"] > 0
    # one session per row, one branch each (the harness sends the history back as the gateway gave it)
    assert m["tito/gateway/branches"] == ROLLOUTS and m["tito/gateway/forks"] == 0
    assert "tito/gateway/harness_failed" not in m and "tito/gateway/engine_fields_missing" not in m
    # as verl counts a rollout's turns (its stock tool loop, tests/runtime/test_four_callers.py): the prompt, the
    # forced calculator call, its result sent back by the harness, and a sampled answer
    assert m["num_turns/mean"] == 4


def test_the_v0_trainer_syncs_its_weights_to_the_rollout_server(demo: DemoResult) -> None:
    sync = r"weight sync (\d+) \(global_steps=(\d+)\): loaded (\d+) tensors, missing=\[\]"
    syncs = re.findall(sync, demo.log.read_text())
    assert [int(s[0]) for s in syncs][:2] == [1, 2] and all(int(s[2]) > 0 for s in syncs), syncs  # before and after


def test_every_session_is_checked_recorded_and_reported(demo: DemoResult) -> None:
    rollouts = [r for r in records(demo) if r["type"] == "rollout"]
    assert len(rollouts) == ROLLOUTS and all(r["check"]["engine_ok"] for r in rollouts)
    assert {r["gateway"]["ended"] for r in rollouts} == {"the harness finished"}
    # each record is its row's: the training step, the dataset's source and row index (not only the gateway session)
    assert {(r["step"], r["data_source"]) for r in rollouts} == {(1, DATA_SOURCE)}
    assert all(isinstance(r["index"], int) for r in rollouts)
    for r in rollouts:  # the harness ran the calculator on the model's call (12 * 7) and sent the result back
        tool = next(m for m in r["messages"] if m["role"] == "tool")
        assert tool["content"] == "84", tool
    assert demo.report is not None and Path(demo.report).is_file()
    html = demo.report.read_text()
    assert "Engine view: 0 failures" in html and "Template audit" in html


def test_every_session_record_replays_to_what_was_trained(demo: DemoResult, capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(str(f) for f in (demo.out / "records").glob("*.jsonl"))
    code = cli(["replay", *files, "--tokenizer", str(demo.out / "tiny-qwen3")])
    out = capsys.readouterr().out
    assert code == 0, out.splitlines()[0]
    assert out.count("recorded stream: the same ") == ROLLOUTS


def test_bypass_mode_measures_the_numbers_inside_the_loss_before_the_first_update(demo: DemoResult) -> None:
    """verl has no old-logprob pass here: the registered policy loss measured the first mini-batch's rollouts
    (trainer logprobs beside the rollout's, before any update), counted the second's unavailable, and the driver
    wrote a numerics line per measured rollout, joined to its rollout line by id, verdict ok."""
    from verl_ext.core.numerics import NumericsOptions, RolloutNumerics

    m = demo.steps[1]
    assert m["tito/numerics/rollouts"] == MEASURED and m["tito/numerics/numerics_unavailable"] == ROLLOUTS - MEASURED
    assert m["tito/numerics/drift_rollouts"] == 0 and 0 < m["tito/numerics/max_abs_delta"] < 1e-4
    lines = [r for r in records(demo) if r["type"] == "numerics"]
    rollout_ids = {r["rollout_id"] for r in records(demo) if r["type"] == "rollout"}
    assert len(lines) == MEASURED and {r["rollout_id"] for r in lines} < rollout_ids
    for line in lines:
        numerics = RolloutNumerics.from_json(line["numerics"])
        assert numerics.source == "bypass_loss" and numerics.step == 1
        assert numerics.verdict(NumericsOptions()).status == "ok"
