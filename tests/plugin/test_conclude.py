"""RolloutRuntime.conclude never propagates a template's refusal to re-render the final messages (issue 8, class 8)."""

from __future__ import annotations

from collections import Counter

from rollouts import TOOLS, call
from template_fixtures import template_renderer

from verl_ext.check import CheckPolicy, ConsistencyChecker, Enforcer, EngineCall
from verl_ext.check.inputs import trainer_sample_from_trajectory
from verl_ext.check.record import Rollout
from verl_ext.core.probe import probe_template
from verl_ext.core.trajectory import TokenTrajectory
from verl_ext.runtime import RolloutRuntime


def test_conclude_in_strict_mode_reports_a_refused_render_without_raising():
    r = template_renderer("meta-llama-Llama-3.2-3B-Instruct.jinja")
    p = probe_template(r)
    policy = CheckPolicy(mode="strict")
    rt = RolloutRuntime(r, p, ConsistencyChecker(r, p, policy), Enforcer(policy), None)
    t = TokenTrajectory(r, p)
    t.start([{"role": "user", "content": "1+1 and 2+2?"}], TOOLS)
    two = {"role": "assistant", "content": "", "tool_calls": [call("1+1", 1), call("2+2", 2)]}
    t.add_sampled([*r.encode("x"), p.boundary("tool").close_ids[0]], [-0.1, -0.2], message=two)
    t.finish()
    turn = t.turns[0]
    calls = [
        EngineCall.of(
            t.input_ids[: turn.prompt_length], t.input_ids[turn.sampled_start : turn.sampled_end], [-0.1, -0.2]
        )
    ]
    counters: Counter[str] = Counter()
    rollout = Rollout.of(
        calls, trainer_sample_from_trajectory(t), t.messages, TOOLS, step=1, prompt_messages=1, response_length=64
    )
    result = rt.conclude(rollout, counters)
    assert result.ok and result.cause_counts()["template_refused"] == 1


def test_a_record_that_cannot_be_written_is_counted_and_the_rollout_goes_on(renderer_for, tmp_path):
    from rollouts import IM_END, Turn, run

    from verl_ext.telemetry.records import RecordWriter, header_record

    r = renderer_for("qwen3")
    p = probe_template(r)
    policy = CheckPolicy()
    writer = RecordWriter(tmp_path, header_record(p))
    writer.path.mkdir()  # the record file's name is taken by a folder: every write fails
    rt = RolloutRuntime(r, p, ConsistencyChecker(r, p, policy), Enforcer(policy), writer)
    ro = run(r, [Turn([*r.encode("<think>\n\n</think>\n\nHi."), IM_END], {"role": "assistant", "content": "Hi."})])
    counters: Counter[str] = Counter()
    result = rt.conclude(Rollout.of(ro.calls, ro.sample(), ro.messages, TOOLS, step=1), counters)
    assert result.ok and counters["records/write_failures"] == 1


def test_write_record_says_whether_the_record_was_written(renderer_for, tmp_path):
    """``write_record``'s contract: True only for a record on disk; False with no writer and for a failed write
    (counted), so that no caller can report a failed write as written."""
    from rollouts import IM_END, Turn, run

    from verl_ext.telemetry.records import RecordWriter, header_record, read_records

    r = renderer_for("qwen3")
    p = probe_template(r)
    policy = CheckPolicy()
    ro = run(r, [Turn([*r.encode("<think>\n\n</think>\n\nHi."), IM_END], {"role": "assistant", "content": "Hi."})])
    rollout = Rollout.of(ro.calls, ro.sample(), ro.messages, TOOLS, step=1)
    checker = ConsistencyChecker(r, p, policy)
    result = checker.check_rollout(rollout)
    counters: Counter[str] = Counter()
    good = RecordWriter(tmp_path / "good", header_record(p))
    assert RolloutRuntime(r, p, checker, Enforcer(policy), good).write_record(rollout, result, counters) is True
    assert len(read_records([good.path])[1]) == 1
    assert RolloutRuntime(r, p, checker, Enforcer(policy), None).write_record(rollout, result, counters) is False
    broken = RecordWriter(tmp_path / "broken", header_record(p))
    broken.path.mkdir(parents=True)  # the record file's name is taken by a folder
    assert RolloutRuntime(r, p, checker, Enforcer(policy), broken).write_record(rollout, result, counters) is False
    assert counters["records/write_failures"] == 1
