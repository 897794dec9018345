"""Policy: strict raises with a message a user can act on; warn logs once per cause per step; options validate."""

from __future__ import annotations

import logging

import pytest
from rollouts import PROMPT, TOOLS, naive, qwen3_answer_turn, qwen3_tool_context

from verl_ext.check import (
    ALLOWED_BY_DESIGN,
    Cause,
    CheckMode,
    CheckPolicy,
    ConsistencyChecker,
    ConsistencyError,
    Enforcer,
)

IM_END = 151645
TOOL_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'


@pytest.fixture
def defective(renderer_for):
    """A decode-and-concatenate rollout whose turn stopped on </tool_call> and got no close: a defect."""
    r = renderer_for("qwen3")
    call = {
        "id": "call00001",
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": "1+1"}},
    }
    messages = [
        *PROMPT,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "2", "tool_call_id": "call00001", "name": "calculator"},
        {"role": "assistant", "content": "The answer is 2."},
    ]
    segments = [
        ("prompt", r.render(PROMPT, TOOLS, add_generation_prompt=True).ids),
        ("sampled", r.encode(TOOL_CALL)),
        ("context", qwen3_tool_context(r)),
        ("sampled", qwen3_answer_turn(r)),
    ]
    calls, sample = naive(r, segments)
    return r, calls, sample, messages


def test_strict_raises_with_an_actionable_message(defective):
    r, calls, sample, messages = defective
    result = ConsistencyChecker(r).check(calls, sample, messages, TOOLS)
    with pytest.raises(ConsistencyError) as err:
        Enforcer(CheckPolicy(mode=CheckMode.STRICT)).enforce(result, step=3)
    text = str(err.value)
    assert "close_missing" in text and "turn 0" in text and "assistant→tool" in text
    assert "allowed_causes" in text and "mode=warn" in text  # says what to do
    assert err.value.result is result


def test_warn_logs_once_per_cause_per_step(defective, caplog):
    r, calls, sample, messages = defective
    result = ConsistencyChecker(r).check(calls, sample, messages, TOOLS)
    enforcer = Enforcer(CheckPolicy(mode=CheckMode.WARN))
    with caplog.at_level(logging.WARNING, logger="verl_ext.check"):
        for _ in range(5):
            enforcer.enforce(result, step=1)
        assert len(caplog.records) == 1 and "close_missing" in caplog.records[0].getMessage()
        enforcer.enforce(result, step=2)
        assert len(caplog.records) == 2 and caplog.records[1].getMessage().startswith("step 2:")


def test_allowing_a_cause_makes_the_rollout_ok(defective):
    r, calls, sample, messages = defective
    policy = CheckPolicy(allowed_causes=ALLOWED_BY_DESIGN | {Cause.CLOSE_MISSING})
    result = ConsistencyChecker(r, policy=policy).check(calls, sample, messages, TOOLS)
    assert result.ok and Cause.CLOSE_MISSING.value in result.cause_counts()


def test_template_view_rate_zero_skips_the_render(defective):
    r, calls, sample, messages = defective
    result = ConsistencyChecker(r, policy=CheckPolicy(template_view_rate=0.0)).check(calls, sample, messages, TOOLS)
    assert not result.template_view and not result.ok  # a missing close is seen without rendering
    assert [f.cause for f in result.findings] == [Cause.CLOSE_MISSING]


def test_off_never_raises(defective):
    r, calls, sample, messages = defective
    result = ConsistencyChecker(r).check(calls, sample, messages, TOOLS)
    Enforcer(CheckPolicy(mode=CheckMode.OFF)).enforce(result)


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"mode": "loud"}, "mode"),
        ({"allowed_causes": ["bpe_remerge", "typo"]}, "allowed_causes"),
        ({"template_view_rate": 2}, "template_view_rate"),
        ({"template_view_rate": "often"}, "template_view_rate"),
        ({"modee": "warn"}, "modee"),
    ],
)
def test_bad_options_name_the_key(options, names):
    with pytest.raises(ValueError, match=names):
        CheckPolicy.from_mapping(options)


@pytest.mark.parametrize(
    "options",
    [
        {"mode": "loud"},
        {"mode": ["warn"]},
        {"allowed_causes": ["default", "typo"]},
        {"allowed_causes": "bpe_remerge"},
        {"template_view_rate": True},
        {"logprob_atol": -1.0},
        {"template_view_budget_s": 0},
    ],
)
def test_config_and_direct_construction_refuse_a_value_with_the_same_one_line_message(options):
    # one rule per key: the YAML path (LoopOptions) and code building a CheckPolicy get the same error
    from verl_ext.plugin.options import LoopOptions, OptionsError

    with pytest.raises(OptionsError) as from_config:
        LoopOptions.from_sources({"check": options})
    with pytest.raises(OptionsError) as direct:
        CheckPolicy(**options)
    message = str(direct.value)
    assert str(from_config.value) == message and message.startswith(f"verl_ext.check.{next(iter(options))}")
    assert "\n" not in message


def test_direct_construction_normalises_like_config():
    policy = CheckPolicy(mode="strict", allowed_causes=["close_missing"], template_view_rate=1)
    assert policy == CheckPolicy.from_mapping({"mode": "strict", "allowed_causes": ["close_missing"]})
    assert policy.mode is CheckMode.STRICT and policy.allowed_causes == {Cause.CLOSE_MISSING}
    assert type(policy.template_view_rate) is float


def test_options_parse():
    policy = CheckPolicy.from_mapping({"mode": "strict", "allowed_causes": ["default", "close_missing"]})
    assert policy.mode is CheckMode.STRICT and Cause.CLOSE_MISSING in policy.allowed_causes
    assert policy.allowed_causes >= ALLOWED_BY_DESIGN


def test_result_is_json_serialisable(defective):
    import json

    from verl_ext.check.record import RecordedCheck

    r, calls, sample, messages = defective
    result = ConsistencyChecker(r).check(calls, sample, messages, TOOLS)
    data = json.loads(json.dumps(RecordedCheck.of(result).to_json()))
    assert data["findings"][0]["cause"] == "close_missing" and data["ok"] is False


def test_a_misspelt_cause_is_refused_with_the_closest_name() -> None:
    with pytest.raises(ValueError) as typo:
        CheckPolicy.from_mapping({"allowed_causes": ["bpe_remerge", "bpe_remerg"]})
    assert "allowed_causes[1]" in str(typo.value) and "did you mean 'bpe_remerge'?" in str(typo.value), typo.value
    with pytest.raises(ValueError) as far:  # nothing close: no guess
        CheckPolicy.from_mapping({"allowed_causes": ["zzzz"]})
    assert "did you mean" not in str(far.value), far.value
