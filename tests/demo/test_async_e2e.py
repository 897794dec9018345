"""End to end under verl's asynchronous trainer: `verl-ext demo --trainer colocate-async --loop all` runs verl's v1
trainer with ``trainer.v1.trainer_mode=colocate_async`` (Ray, FSDP2 on gloo, the CPU engine): at each sample's end
verl aborts the requests in flight, trains, updates the weights and resumes them. The rows name the three loops in
turn (``agent_name``): verl_ext_tool_agent, verl_ext_audited_tool_agent (verl's stock tool_agent, watched) and
verl_ext_gateway_agent (the demo's openai-SDK harness through the gateway). The CPU engine's ``abort_after`` hook holds
one request per weight version after 4 sampled ids until verl's abort, so a turn resumes across each update whatever
the timing, and its truth log says which version generated which ids.

One trainer start, 2 steps (162 s on a 2-core CI-class VM at load average 4-8, 7 minutes at 10-20; the suite's
other starts are in tests/demo/conftest.py, test_demo_faults.py, test_gateway_demo.py and test_vl_demo.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from verl_ext.demo.run import ALL_LOOPS, PARK_TOKENS, TRUTH_LOG, DemoResult, run_demo
from verl_ext.engines.cpu_pause import ids_digest, read_truth

pytestmark = [pytest.mark.timeout(1800), pytest.mark.xdist_group("ray")]

VERSION_CAUSES = {  # the version view's defects (verl_ext/check/version_view.py)
    "resume_retokenized",
    "segment_discarded",
    "segment_logprobs_misplaced",
    "version_stamped_on_return",
    "version_went_back",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    lines: list[str] = []
    result = run_demo(
        tmp_path_factory.mktemp("demo-async"), steps=2, trainer="colocate-async", loop="all", say=lines.append
    )
    assert result.returncode == 0, "\n".join(lines)
    return result


def rollouts(result: DemoResult) -> list[dict[str, Any]]:
    records = [json.loads(x) for f in (result.out / "records").glob("*.jsonl") for x in f.read_text().splitlines()]
    return [r for r in records if r["type"] == "rollout"]


def test_the_trainer_ran_under_colocate_async_with_every_loop(run: DemoResult) -> None:
    assert sorted(run.steps) == [1, 2]
    assert "trainer.v1.trainer_mode=colocate_async" in run.log.read_text().splitlines()[0]  # the command line
    records = rollouts(run)
    assert {r["loop"] for r in records} >= set(ALL_LOOPS)
    # a gateway rollout still running when the trainer finishes is cancelled, and its session is recorded as the
    # standalone gateway's (no training plan): the only other name a record may carry here
    others = [r for r in records if r["loop"] not in ALL_LOOPS]
    assert all(r["loop"] == "verl-ext gateway" and "cancelled" in r["gateway"]["ended"] for r in others), others


def test_the_engine_view_passes_on_every_rollout(run: DemoResult) -> None:
    for metrics in run.steps.values():
        assert metrics["tito/engine_view_failures"] == 0
    records = rollouts(run)
    assert records and all(r["check"]["engine_ok"] for r in records)
    causes = {f["cause"] for r in records for f in r["check"]["findings"] if not f["allowed"]}
    assert not causes & VERSION_CAUSES, causes


def test_a_turn_resumed_across_a_weight_update(run: DemoResult) -> None:
    resumed = sum(m.get("tito/engine/continued_turns", 0) for m in run.steps.values())
    assert resumed >= 1
    mixed = [
        call
        for r in rollouts(run)
        for call in r["versions"]["calls"]
        if len(call) > 1 and call[0][0] != call[-1][0]  # attempts on two versions
    ]
    assert mixed, "no recorded turn spans two weight versions"
    assert any(call[0][2] - call[0][1] == PARK_TOKENS for call in mixed)  # the held request: exactly 4 ids first


def test_every_attempts_version_is_the_one_the_engine_generated_it_on(run: DemoResult) -> None:
    """Each engine call's recorded attempts (rows [version, start, end, ...]) against the engine's truth log: the
    request whose prompt was the call's prompt + the ids before ``start`` generated ``[start, end)`` on ``version``."""
    truth = read_truth(Path(run.out) / TRUTH_LOG)
    checked = 0
    for record in rollouts(run):
        calls, attempts = record["engine_calls"], record["versions"]["calls"]
        assert len(calls) == len(attempts), record["loop"]
        for call, rows in zip(calls, attempts, strict=True):
            prompt = record["input_ids"][: call["prompt_length"]]
            output = call["output_ids"]
            assert rows[-1][2] == len(output) and [r[1] for r in rows] == [0, *[r[2] for r in rows[:-1]]]
            for version, start, end, *_ in rows:
                line = truth[ids_digest([*prompt, *output[:end]])]
                assert (line["version"], line["prompt_len"], line["ids"]) == (version, len(prompt) + start, end - start)
                checked += 1
    assert checked >= len(rollouts(run))
