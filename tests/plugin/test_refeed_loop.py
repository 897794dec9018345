"""The re-feed audit wired into verl_ext_tool_agent (plugin/refeed_loop.py): verl's loop in process, the real CPU
engine, its scoring path reached through the server manager's sticky routing; no trainer start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from loop_harness import run_loop

from verl_ext.core.errors import OptionsError
from verl_ext.core.numerics import NumericsOptions
from verl_ext.plugin import metrics_sink
from verl_ext.plugin.options import LoopOptions
from verl_ext.telemetry.records import read_record_files

PROMPTS = [
    [{"role": "user", "content": "What is 12 * 7?"}],
    [{"role": "user", "content": "Name a prime number."}],
    [{"role": "system", "content": "Use the calculator tool."}, {"role": "user", "content": "What is 3 + 4?"}],
]
CPU = ["actor_rollout_ref.rollout.name=verl_ext_cpu"]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call><|im_end|>'


def _lines(folder: Path) -> tuple[list[dict], list[dict]]:
    lines = [json.loads(x) for f in sorted(folder.glob("*.jsonl")) for x in f.read_text().splitlines()]
    return [x for x in lines if x["type"] == "rollout"], [x for x in lines if x["type"] == "numerics"]


def _run(make_loop, folder: Path, fraction: float, faults=None, force_text=None):
    metrics_sink.drain()
    options = {"records": {"dir": str(folder)}, "numerics": {"refeed_fraction": fraction}}
    loop, server = make_loop(verl_ext=options, extra=CPU, faults=faults, force_text=force_text, response_length=48)
    outs = [run_loop(loop, prompt, global_steps=1) for prompt in PROMPTS]
    return outs, server, metrics_sink.drain()


@pytest.mark.parametrize("force_text", [None, CALL], ids=["one_turn", "tool_call_turns"])
def test_fraction_one_writes_an_ok_refeed_line_per_rollout(make_loop, tmp_path, force_text):
    outs, server, m = _run(make_loop, tmp_path, 1.0, force_text=force_text)
    rollouts, numerics = _lines(tmp_path)
    assert len(rollouts) == len(PROMPTS) and len(numerics) == len(PROMPTS)
    assert sorted(n["rollout_id"] for n in numerics) == sorted(r["rollout_id"] for r in rollouts)
    assert {o.extra_fields["verl_ext_rollout_id"] for o in outs} == {r["rollout_id"] for r in rollouts}
    records = read_record_files(sorted(tmp_path.glob("*.jsonl"))).numerics
    for record in records:
        assert record.numerics.source == "refeed"
        assert record.numerics.verdict(record.options).status == "ok"
        (out,) = [o for o in outs if o.extra_fields["verl_ext_rollout_id"] == record.rollout_id]
        assert record.numerics.overall.tokens == sum(out.response_mask) > 0  # every sampled token compared, no other
        assert record.numerics.overall.max_abs <= 1e-4  # the CPU engine agrees with itself (the canary's tolerance)
    if force_text is not None:
        assert any(len(r.numerics.by_turn) >= 2 for r in records)  # later turns re-scored too
    assert m["tito/numerics/refeed_audited"] == len(PROMPTS) and m.get("tito/numerics/refeed_refused", 0) == 0
    # routed as the rollout's turns were: the sticky request id, released after
    requests = set(server.acquired)
    assert len(requests) == len(PROMPTS) and server.released == server.acquired


def test_a_shifted_scoring_path_is_refused_by_the_canary_and_writes_nothing(make_loop, tmp_path):
    outs, server, m = _run(make_loop, tmp_path, 1.0, faults=[{"kind": "score_shift", "shift": -0.5}])
    rollouts, numerics = _lines(tmp_path)
    assert len(rollouts) == len(PROMPTS) and numerics == []
    assert m["tito/numerics/refeed_refused"] == len(PROMPTS) and m.get("tito/numerics/refeed_audited", 0) == 0
    assert all(o.extra_fields["verl_ext_check"]["engine_ok"] for o in outs)  # training goes on


def test_fraction_zero_audits_nothing(make_loop, tmp_path):
    _, server, m = _run(make_loop, tmp_path, 0.0)
    rollouts, numerics = _lines(tmp_path)
    assert len(rollouts) == len(PROMPTS) and numerics == [] and server.acquired == []
    assert not any(k.startswith("tito/numerics/refeed") for k in m)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), float("inf"), "0.5", True, None])
def test_a_fraction_out_of_range_is_refused_naming_the_key_and_the_fix(bad):
    with pytest.raises(OptionsError) as raised:
        LoopOptions.from_sources({"numerics": {"refeed_fraction": bad}})
    message = str(raised.value)
    assert "verl_ext.numerics.refeed_fraction" in message and "from 0 (off) to 1" in message, message


@pytest.mark.parametrize("good", [0, 0.05, 1])
def test_a_fraction_in_range_is_taken(good):
    assert LoopOptions.from_sources({"numerics": {"refeed_fraction": good}}).numerics.refeed_fraction == good
    assert NumericsOptions(refeed_fraction=good).problems() == []


def test_the_preflight_refuses_a_fraction_out_of_range_before_ray_starts():
    from loop_harness import verl_config

    from verl_ext.plugin.preflight import check_config

    with pytest.raises(OptionsError, match=r"verl_ext.numerics.refeed_fraction .*from 0 \(off\) to 1"):
        check_config(verl_config(["+verl_ext=warn", "verl_ext.numerics.refeed_fraction=2"]))
    check_config(verl_config(["+verl_ext=warn", "verl_ext.numerics.refeed_fraction=0.25"]))  # in range: taken
