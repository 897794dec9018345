"""Where the engine samples the template's own rendering of each turn, verl_ext continues as the template does.

DeepSeek's templates: V3.1 and R1-Distill (fixtures), and R1's original shape (``synthetic_templates``), which writes
no close after a single tool call (``<｜tool▁call▁end｜>`` runs straight into ``<｜tool▁outputs▁begin｜>``) and closes
only several. R1's templates also never reset their namespace flags: every tool result of a conversation goes into
one outputs block, every later call turn into the first calls block. A property test over turn sequences (one or
two calls, text answers followed by a user message) whose sampled turns are the template's own rendering of each
message in its place: what verl_ext appends after each turn is, as text, what the template's render of the
conversation so far writes after it (no close the template does not write, no second outputs block), and the check
finds no defect.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic_templates import deepseek_r1_single_call_unclosed
from template_fixtures import template_path, template_renderer

from verl_ext.check import ConsistencyChecker, EngineCall
from verl_ext.check.inputs import trainer_sample_from_trajectory
from verl_ext.check.policy import CheckPolicy
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.trajectory import TokenTrajectory

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "A test tool.",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        },
    }
]
R1 = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"
TEMPLATES = ("deepseek-ai-DeepSeek-V3.1", R1, "r1-single-call-unclosed")


@functools.cache
def renderer(name: str) -> ChatRenderer:
    if name == "r1-single-call-unclosed":
        text = deepseek_r1_single_call_unclosed(template_path(R1).read_text())
        return ChatRenderer(template_renderer(R1).tokenizer, chat_template=text)
    return template_renderer(name)


def own_rendering(r: ChatRenderer, history: list[dict[str, Any]], message: dict[str, Any]) -> tuple[str, str]:
    """(the prompt's text, the template's text for ``message`` after it): what a model trained on the template
    samples there, read off the render of the conversation with the message (from where it leaves the prompt)."""
    prompt = r.render_text(history, TOOLS, add_generation_prompt=True)
    full = r.render_text([*history, message], TOOLS, add_generation_prompt=False)
    shared = len(os.path.commonprefix([prompt, full]))
    return prompt, full[shared:]


def call(n: int) -> dict[str, Any]:
    return {
        "id": f"call{n:05d}",
        "type": "function",
        "function": {"name": "calculator", "arguments": f'{{"x": "{n}"}}'},
    }


TURNS = st.lists(st.sampled_from(["call", "calls", "text"]), min_size=1, max_size=4)


def run(name: str, kinds: list[str]) -> tuple[list[str], Any]:
    """The rollout of ``kinds`` (then a final answer); returns where the context differs from the template's render
    (one line per turn) and the check's result."""
    r = renderer(name)
    p = probe_template(r)
    t = TokenTrajectory(r, p)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 1+1?"}]
    prompt_ids = t.start(messages, TOOLS)
    calls_made, engine_calls, differences = 0, [], []
    for k, kind in enumerate([*kinds, "end"]):
        if kind in ("call", "calls"):
            n = 1 if kind == "call" else 2
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [call(calls_made + i + 1) for i in range(n)],
            }
            replies = [
                {"role": "tool", "content": f"r{calls_made + i + 1}", "tool_call_id": f"call{calls_made + i + 1:05d}"}
                for i in range(n)
            ]
            calls_made += n
        else:
            message = {"role": "assistant", "content": f"Answer {k}."}
            replies = [{"role": "user", "content": f"Next {k}"}] if kind == "text" else []
        _, text = own_rendering(r, messages, message)
        ids = r.encode(text)
        engine_calls.append(EngineCall.of(list(prompt_ids), ids, [-0.5] * len(ids), "stop"))
        t.add_sampled(ids, [-0.5] * len(ids), "stop", message=message)
        messages.append(message)
        if not replies:
            break
        end = len(t.input_ids)
        prompt_ids = t.append_messages(replies)
        after_turn = r.render_text(messages, TOOLS, add_generation_prompt=False)
        messages += replies
        expected = r.render_text(messages, TOOLS, add_generation_prompt=True)
        got = r.decode(t.input_ids[end:])
        if not expected.startswith(after_turn) or expected[len(after_turn) :] != got:
            differences.append(f"turn {k}: stream {got!r}, template {expected[len(after_turn) :]!r}")
    t.finish()
    sample = trainer_sample_from_trajectory(t, 4096)
    result = ConsistencyChecker(r, p, CheckPolicy(mode="warn")).check(
        engine_calls, sample, t.messages, TOOLS, template_view=True
    )
    return differences, result


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_context_is_the_templates_continuation_and_the_check_is_clean(name):
    @settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(kinds=TURNS)
    def holds(kinds):
        differences, result = run(name, kinds)
        assert not differences, differences
        assert result.engine_ok, result.summary()
        assert not result.defects, [(f.cause.value, f.turn, f.stream_text, f.rendered_text) for f in result.defects]

    holds()


def test_a_single_call_the_template_leaves_unclosed_gets_no_close_and_two_rounds_share_one_outputs_block():
    """The issue's cases, named: no synthetic ``<｜end▁of▁sentence｜>`` after a single call's
    ``<｜tool▁call▁end｜>``, and a second round's result written into the first round's outputs block."""
    r = renderer("r1-single-call-unclosed")
    p = probe_template(r)
    assert p.boundary("tool").close_omitted and p.tool_rounds_share_state
    differences, result = run("r1-single-call-unclosed", ["call", "call"])
    assert not differences and result.ok, (differences, result.summary())
    assert not [f for f in result.findings if f.cause.value == "synthetic_close"], result.summary()
    differences, result = run(R1, ["call", "call"])
    assert not differences and result.ok, (differences, result.summary())
