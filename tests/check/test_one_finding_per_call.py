"""A call the template re-serializes is one finding, whatever the number of places its JSON is written otherwise
(``template_view._one_per_call``): a compact call (``{"name":"calc",...}`` where the template writes spaces) drew one
finding per space before, four per call. Joined only inside one call block the message holds, on both sides: a
changed argument in that call is still ``message_differs`` in its turn, and two calls stay two findings."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from long_rollouts import templated_tool_rollout

from verl_ext.check import CheckPolicy, ConsistencyChecker
from verl_ext.check.findings import Cause
from verl_ext.core.probe import probe_template

TURNS = 5
# the templates whose calls are re-serialized in several places when sampled compact (bench/check_linear.py's rows)
COMPACT = {
    "qwen3": ({}, {"extra": {"reasoning_content": "Let me see."}, "compact": True}),
    "qwen3 think block": ({}, {"compact": True}),
    "qwen2.5": ({}, {"compact": True}),
}


def _check(renderer: Any, how: dict[str, Any], edit: Any = None) -> Any:
    profile = probe_template(renderer)
    rollout = templated_tool_rollout(renderer, profile, TURNS, **how)()
    if edit is not None:
        rollout = dataclasses.replace(rollout, messages=edit(copy.deepcopy(list(rollout.messages))))
    checker = ConsistencyChecker(renderer, profile, policy=CheckPolicy(template_view_budget_s=None, mode="warn"))
    return checker.check_rollout(rollout, template_view=True)


@pytest.mark.parametrize("name", sorted(COMPACT))
def test_a_compact_call_is_one_reserialized_finding(renderer_for, name):
    kwargs, how = COMPACT[name]
    result = _check(renderer_for(name.split()[0]).with_template_kwargs(kwargs), how)
    assert result.ok, result.summary()
    calls = [f for f in result.findings if f.cause is Cause.TOOL_CALL_RESERIALIZED]
    assert sorted(f.turn for f in calls) == list(range(TURNS)), [(f.turn, f.stream_text) for f in calls]
    for f in calls:  # the finding spans the call's differing places, and what lies between them
        assert f.stream_text.count(":") >= 2 and f.stream_text != f.rendered_text


@pytest.mark.parametrize("name", sorted(COMPACT))
def test_a_changed_argument_in_a_compact_call_stays_message_differs_in_its_turn(renderer_for, name):
    kwargs, how = COMPACT[name]

    def change_turn_2(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        assistants = [m for m in messages if m.get("role") == "assistant" and m.get("tool_calls")]
        call = assistants[2]["tool_calls"][0]
        fn = call.get("function", call)
        args = fn["arguments"]
        fn["arguments"] = {**args, "b": 987654} if isinstance(args, dict) else args.replace("}", ', "b": 987654}')
        return messages

    result = _check(renderer_for(name.split()[0]).with_template_kwargs(kwargs), how, change_turn_2)
    assert not result.ok
    differs = [f for f in result.findings if f.cause is Cause.MESSAGE_DIFFERS]
    # not joined where the message does not hold the call: each place the engine's call differs is shown
    assert len(differs) > 1 and {f.turn for f in differs} == {2}, [(f.cause, f.turn, f.detail) for f in result.findings]
