"""The check never cries wolf on rollouts verl_ext's loop builds, from any engine output.

Rollouts come from ``loop_rollouts``: arbitrary engine output (odd text real models emit, the template's own
tool-call text, random ids, partial UTF-8, stray think tags, length cuts, empty outputs) fed through the loop's
own steps. The stream is right by construction, so the template view must report no defect and the engine view no
failure. Derandomized: the same examples every run, and a failure names its example.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loop_rollouts import build_loop_rollout, canonical_call_text, engine_output, verl_parser

from verl_ext.check import ConsistencyChecker
from verl_ext.check.policy import CheckPolicy
from verl_ext.core.probe import probe_template

CASES = [
    pytest.param("gpt-oss", {}, id="gpt-oss"),
    pytest.param("qwen3", {}, id="qwen3"),
    pytest.param("qwen3", {"enable_thinking": False}, id="qwen3-no-thinking"),
    pytest.param("qwen2.5", {}, id="qwen2.5"),
    pytest.param("mistral-7b-v0.3", {}, id="mistral"),
]


@pytest.mark.parametrize(("family", "kwargs"), CASES)
def test_no_defect_on_any_engine_output(renderer_for, family, kwargs):
    r = renderer_for(family).with_template_kwargs(kwargs)
    profile = probe_template(r)
    parser = verl_parser(r, profile)
    calls = [canonical_call_text(r, profile, {"expression": "1+2"}), canonical_call_text(r, profile, '{"x": "3"}')]
    checker = ConsistencyChecker(r, profile, CheckPolicy(mode="warn"))

    @settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def holds(data):
        outputs = data.draw(st.lists(engine_output(r, profile, calls), min_size=1, max_size=4))
        texts = data.draw(st.lists(st.sampled_from(["2", "", " 3\n", "<|im_end|>", "x\ny", "  "]), max_size=4))
        user = data.draw(st.booleans())
        budget = data.draw(st.sampled_from([16, 64, 512]))
        _, rollout = build_loop_rollout(
            r, profile, parser, outputs, texts, user_after_text=user, response_length=budget
        )
        result = checker.check_rollout(rollout, template_view=True)
        assert not result.engine_failures, result.summary()
        defects = [f for f in result.findings if not f.allowed]
        assert not defects, [(f.cause.value, f.turn, f.stream_text, f.rendered_text, f.detail) for f in defects]

    holds()
