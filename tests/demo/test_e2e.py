"""End to end: `verl-ext demo` runs verl's real GRPO trainer (Ray, FSDP2 on gloo, the CPU engine) with
verl_ext_tool_agent, under the v1 (TransferQueue) trainer; the legacy v0 trainer runs the gateway's demo
(tests/demo/test_gateway_demo.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from verl_ext.cli.main import main as cli
from verl_ext.demo.run import DemoResult

pytestmark = [pytest.mark.timeout(1200), pytest.mark.xdist_group("ray")]  # demo beside a worker; Ray group


# verl's v1 trainer here; its deprecated v0 trainer runs in tests/demo/test_gateway_demo.py (one trainer start less:
# each start is minutes of the suite's 30 on 2 cores)
@pytest.fixture(scope="module", params=["v1"])
def demo(request: pytest.FixtureRequest, demo_runs: Callable[[str], Any]) -> DemoResult:
    run = demo_runs(request.param)  # the session's run (the docs check reads the v1 run too)
    assert run.result.returncode == 0, "\n".join(run.lines)
    return run.result


def rollouts(result: DemoResult) -> list[dict]:
    records = [
        json.loads(line) for f in (result.out / "records").glob("*.jsonl") for line in f.read_text().splitlines()
    ]
    return [r for r in records if r["type"] == "rollout"]


def test_steps_complete_with_gradients(demo: DemoResult) -> None:
    assert sorted(demo.steps) == [1, 2]
    for metrics in demo.steps.values():
        assert metrics["actor/grad_norm"] > 0
        assert metrics["num_turns/mean"] >= 4  # system+user, the forced tool call, the tool result, an answer


def test_weights_reach_the_rollout_server_every_step(demo: DemoResult) -> None:
    log = demo.log.read_text()
    syncs = re.findall(r"weight sync (\d+) \(global_steps=(\d+)\): loaded (\d+) tensors, missing=\[\]", log)
    assert [int(s[0]) for s in syncs][:2] == [1, 2] and all(int(s[2]) > 0 for s in syncs)
    # after step 1's update the engine's logprobs still match the trainer's: it serves the updated weights
    assert demo.steps[2]["training/rollout_probs_diff_max"] < 1e-3


def test_engine_view_passes_on_every_rollout(demo: DemoResult) -> None:
    for metrics in demo.steps.values():
        assert metrics["tito/rollouts_checked"] == 4 and metrics["tito/engine_view_failures"] == 0
        assert metrics["tito/tool/calls"] == 4 and metrics["tito/tool/ok"] == 4
        assert metrics["tito/lost_sampled_tokens"] == 0  # each turn asked only for the budget left
        assert metrics["tito/loop/verl_ext_tool_agent"] == 4 and "tito/loop/bypassed" not in metrics  # which loop ran
    records = rollouts(demo)
    assert len(records) == 8 and all(r["check"]["engine_ok"] for r in records)
    assert {r["step"] for r in records} == {1, 2}


def test_every_record_replays_to_what_was_trained(demo: DemoResult, capsys: pytest.CaptureFixture[str]) -> None:
    # Every demo rollout fills its response budget (a random model rarely stops): the loop's synthetic close after
    # the cut lies past the trainer's cap, and replay must cut where the trainer did (record key response_length).
    files = sorted(str(f) for f in (demo.out / "records").glob("*.jsonl"))  # as docs/troubleshooting.md says
    code = cli(["replay", *files, "--tokenizer", str(demo.out / "tiny-qwen3")])
    out, err = capsys.readouterr()
    assert code == 0, out.splitlines()[0]
    assert out.count("recorded stream: the same ") == 8
    # the driver's numerics file among them: its 8 lines (one per rollout) read and skipped, said in one line
    (said,) = [line for line in err.splitlines() if "numerics line" in line]
    assert said.startswith("verl-ext replay: read 8 numerics lines (") and "/numerics-" in said


def test_rollout_and_trainer_logprobs_agree(demo: DemoResult) -> None:
    for metrics in demo.steps.values():
        assert metrics["training/rollout_probs_diff_max"] < 1e-3


def test_report_names_the_causes_found(demo: DemoResult) -> None:
    assert demo.report is not None
    html = demo.report.read_text()
    causes = {f["cause"] for r in rollouts(demo) for f in r["check"]["findings"]}
    assert causes  # a random model's re-encoded text always differs somewhere
    for cause in causes:
        assert cause in html
    assert "Template audit" in html and "Engine view: 0 failures" in html


def test_step_line_parser() -> None:
    from verl_ext.demo.run import parse_step_line

    line = "\x1b[36m(TaskRunnerV1 pid=1)\x1b[0m step:3 - a/b:0.5 - c:np.float64(-1.5e-05) - d:np.int32(5) - e:abc\n"
    assert parse_step_line(line) == (3, {"a/b": 0.5, "c": -1.5e-05, "d": 5.0})
    assert parse_step_line("no step here") is None


def numerics_lines(result: DemoResult) -> list[dict]:
    records = [
        json.loads(line) for f in (result.out / "records").glob("*.jsonl") for line in f.read_text().splitlines()
    ]
    return [r for r in records if r["type"] == "numerics"]


def test_every_rollout_gets_the_trainers_numbers_beside_the_engines(demo: DemoResult) -> None:
    """The old-logprob pass's logprobs joined with the engine's by rollout id: one numerics line per rollout, every
    one measured (none unavailable), the clean run's verdict ok at every depth and turn; the baseline is float32
    rounding (the CPU engine and the fp32 trainer compute the same logprobs apart: a few units in the last place)."""
    from verl_ext.core.numerics import NumericsOptions, RolloutNumerics

    for step, metrics in demo.steps.items():
        assert metrics["tito/numerics/rollouts"] == 4 and metrics["tito/numerics/numerics_unavailable"] == 0, step
        assert metrics["tito/numerics/drift_rollouts"] == 0
        assert metrics["tito/numerics/tokens"] == metrics["tito/sampled_tokens"]  # every sampled token, no other
        assert 0 < metrics["tito/numerics/max_abs_delta"] < 1e-4
        assert metrics["tito/numerics/turn/0/tokens"] > 0 and metrics["tito/numerics/turn/1/tokens"] > 0
    lines = numerics_lines(demo)
    by_id = {r["rollout_id"]: r for r in rollouts(demo)}
    assert sorted(line["rollout_id"] for line in lines) == sorted(by_id)  # one each, joined by id
    options = NumericsOptions()
    for line in lines:
        numerics = RolloutNumerics.from_json(line["numerics"])
        assert numerics.source == "old_log_prob" and numerics.step == by_id[line["rollout_id"]]["step"]
        assert numerics.verdict(options).status == "ok"
        # the tokens measured are the rollout's sampled ones (mask 1), turn by turn as the engine sampled them
        record = by_id[line["rollout_id"]]
        assert numerics.overall.tokens == sum(record["loss_mask"])
        assert len(numerics.by_turn) == len(record["engine_calls"])


def test_the_demo_prints_a_numerics_line_per_step(demo_runs: Callable[[str], Any]) -> None:
    lines = [line for said in demo_runs("v1").lines for line in said.splitlines()]  # a step is said as one block
    steps = [i for i, line in enumerate(lines) if "] step " in line]
    assert len(steps) == 2
    for i in steps:
        numerics = next(line for line in lines[i:] if line.startswith("    numerics"))
        assert re.match(r"    numerics: 4 rollouts, 0 unavailable, 0 drift; \|Δ\| mean \S+ max \S+, k3 ", numerics)
        assert "by depth: 0-512 " in numerics and "by turn: 0 " in numerics
