"""A finding names the message that differs: one context message edited in what the check is given is reported as
``context_differs``, in that message's turn, and nothing else is; two sides that print alike show their ids."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from loop_rollouts import build_loop_rollout, verl_parser
from template_fixtures import template_renderer

from verl_ext.check import Cause, ConsistencyChecker
from verl_ext.check.policy import CheckPolicy
from verl_ext.check.texts_alike import alike_note
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer

# (template, its turn close as text)
TEMPLATES = {
    "qwen3": "<|im_end|>",
    "deepseek-ai-DeepSeek-V3.1": "<｜end▁of▁sentence｜>",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "<｜end▁of▁sentence｜>",
    "google-gemma-2-2b-it": "<end_of_turn>",
    "meta-llama-Llama-3.2-3B-Instruct": "<|eot_id|>",
}


@functools.cache
def renderer(name: str, shipped: ChatRenderer | None = None) -> ChatRenderer:
    return shipped or template_renderer(name)


def chat(r: ChatRenderer, close: str):
    """Three answers, each followed by a user message (as a chat loop builds it)."""
    p = probe_template(r)
    outputs = [r.encode(f"Answer {k}.{close}") for k in range(3)]
    _, rollout = build_loop_rollout(
        r, p, verl_parser(r, p), outputs, ["How are you?", "And now?"], user_after_text=True, tools=None
    )
    return p, rollout


@pytest.mark.parametrize("name", list(TEMPLATES))
@pytest.mark.parametrize("edited", [0, 2, 4])
def test_an_edited_user_message_is_named_in_its_turn_and_alone(renderer_for, name, edited):
    r = renderer_for(name) if name == "qwen3" else renderer(name)
    p, rollout = chat(r, TEMPLATES[name])
    messages = [dict(m) for m in rollout.messages]
    assert messages[edited]["role"] == "user"
    messages[edited]["content"] = messages[edited]["content"].replace("you", "we").replace("What", "Who")
    messages[edited]["content"] = messages[edited]["content"].replace("now", "then")
    result = ConsistencyChecker(r, p, CheckPolicy(mode="warn")).check_rollout(
        dataclasses.replace(rollout, messages=tuple(messages)), template_view=True
    )
    turn = (edited - 1) // 2 if edited else 0  # appended after that engine call (the prompt's: turn 0)
    defects = [(f.cause.value, f.turn, f.stream_text, f.rendered_text) for f in result.defects]
    assert defects and all(f.cause is Cause.CONTEXT_DIFFERS and f.turn == turn for f in result.defects), defects
    assert all(f"message {edited} (user)" in f.detail for f in result.defects), defects
    for f in result.findings:  # no finding shows two equal texts as a difference
        assert repr(f.stream_text) != repr(f.rendered_text) or "print alike" in f.detail or f.allowed, f


def test_two_sides_that_print_alike_show_their_ids(renderer_for):
    r = renderer_for("qwen3")
    a, b = r.encode("Answer"), [*r.encode("Ans"), *r.encode("wer")]
    assert a != b and r.decode(a) == r.decode(b)
    note = alike_note(r, a, b, r.decode(a), r.decode(b))
    assert f"ids {a}" in note and f"ids {b}" in note and "tokens" in note
    assert alike_note(r, a, a, "x", "x") == "" and alike_note(r, a, b, "x", "y") == ""
