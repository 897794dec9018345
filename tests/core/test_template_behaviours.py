"""Template behaviours that made the check report defects on correct rollouts, each on real template text: a
rollout verl_ext builds from the engine's output for such a template has zero defects and zero engine-view
failures (asserted on the verdict and counts, not on finding text)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from rollouts import TOOLS, Rollout, Turn, run
from template_fixtures import template_renderer

from verl_ext.check import ConsistencyChecker
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.replay import ReplayRecord, replay
from verl_ext.core.tool_call_shape import ARGUMENTS_EITHER, ARGUMENTS_OBJECT

LLAMA = ("meta-llama-Llama-3.3-70B-Instruct", "meta-llama-Llama-3.2-3B-Instruct")
PROMPT = [{"role": "user", "content": "What is 1+1? Use the calculator."}]


def openai_call(arguments: Any = '{"expression": "1+1"}') -> dict[str, Any]:
    """A tool call as an OpenAI-format parser returns it: arguments as a JSON string."""
    return {"id": "call00001", "type": "function", "function": {"name": "calculator", "arguments": arguments}}


RESULT = {"role": "tool", "content": "2", "tool_call_id": "call00001", "name": "calculator"}


def assert_clean(r: ChatRenderer, ro: Rollout, tools: Sequence[Mapping[str, Any]] | None = TOOLS) -> None:
    """The check, template view forced on: no defect, no engine-view failure."""
    result = ConsistencyChecker(r, probe_template(r)).check(
        ro.calls, ro.sample(), ro.messages, tools, template_view=True
    )
    assert result.engine_ok, result.engine_failures
    assert not result.defects, [(f.cause.value, f.detail) for f in result.defects]
    assert result.ok


# -- tool-call arguments through tojson ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", LLAMA)
def test_a_tojson_template_takes_arguments_as_objects_only(name):
    """Llama 3.x writes ``arguments | tojson``: a JSON string comes out double-encoded, so the shape is "object"
    (the marker is in both renders; the text tells them apart), and string arguments are parsed before rendering."""
    p = probe_template(template_renderer(name))
    assert p.tool_call_shape.arguments == ARGUMENTS_OBJECT
    (m,) = p.tool_call_shape.conform([{"role": "assistant", "content": "", "tool_calls": [openai_call()]}])
    assert m["tool_calls"][0]["function"]["arguments"] == {"expression": "1+1"}


def test_templates_that_take_either_form_keep_either(renderer_for):
    assert probe_template(renderer_for("qwen3")).tool_call_shape.arguments == ARGUMENTS_EITHER


@pytest.mark.parametrize("name", LLAMA)
def test_a_tojson_template_rollout_with_string_arguments_has_no_defect(name):
    r = template_renderer(name)
    out = r.encode('{"name": "calculator", "parameters": {"expression": "1+1"}}<|eot_id|>')
    call_turn = {"role": "assistant", "content": "", "tool_calls": [openai_call()]}
    final = {"role": "assistant", "content": "It is 2."}
    ro = run(r, [Turn(out, call_turn, [RESULT]), Turn(r.encode("It is 2.<|eot_id|>"), final)], prompt=PROMPT)
    assert_clean(r, ro)


@pytest.mark.parametrize("name", LLAMA)
def test_replay_never_trains_a_double_encoded_call(name):
    r = template_renderer(name)
    call_turn = {"role": "assistant", "content": "", "tool_calls": [openai_call()]}
    record = {"messages": [*PROMPT, call_turn, RESULT, {"role": "assistant", "content": "It is 2."}], "tools": TOOLS}
    t = replay(r, ReplayRecord.from_json(record))
    sampled = r.decode([i for i, m in zip(t.input_ids, t.loss_mask, strict=True) if m])
    assert '"parameters": {"expression": "1+1"}' in sampled and '\\"' not in sampled, sampled
