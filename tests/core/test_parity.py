"""Parity: with the canonical output as sampled ids, the stream is the template's own rendering,
except exactly where the probe says the template is not prefix-preserving."""

from __future__ import annotations

import pytest
from conversations import CALL, TOOLS

from verl_ext.core.probe import probe_template
from verl_ext.core.replay import ReplayRecord, replay
from verl_ext.core.template_profile import END

TOOL_LOOP = [
    {"role": "user", "content": "What is 1+1?"},
    {"role": "assistant", "content": "", "reasoning_content": "Use the tool.", "tool_calls": [CALL]},
    {"role": "tool", "content": "2", "tool_call_id": "call00001", "name": "calculator"},
    {"role": "assistant", "content": "1+1 = 2."},
]


@pytest.mark.parametrize("family", ["qwen3", "qwen2.5", "gpt-oss", "mistral-7b-v0.3"])
def test_tool_loop_matches_apply_chat_template(renderer_for, family):
    r = renderer_for(family)
    # TOOL_LOOP's call turn has reasoning: the kind of turn every template here keeps before a tool message
    assert "reasoning" not in probe_template(r).boundary("tool").not_preserving_with
    t = replay(r, ReplayRecord.from_json({"messages": TOOL_LOOP, "tools": TOOLS}))
    expected = r.tokenizer.apply_chat_template(TOOL_LOOP, tools=TOOLS, tokenize=True)["input_ids"]
    assert t.input_ids + list(probe_template(r).boundary(END).trailer_ids) == expected


def test_qwen3_differs_exactly_where_reasoning_is_stripped(renderer_for):
    r = renderer_for("qwen3")
    profile = probe_template(r)
    assert profile.strips_reasoning and not profile.boundary("user").prefix_preserving
    chat = [
        {"role": "user", "content": "How are you?"},
        {"role": "assistant", "content": "I am good!", "reasoning_content": "Be polite."},
        {"role": "user", "content": "What is your name?"},
        {"role": "assistant", "content": "Qwen."},
    ]
    t = replay(r, ReplayRecord.from_json({"messages": chat}))
    expected = r.tokenizer.apply_chat_template(chat, tokenize=True)["input_ids"]
    stream = t.input_ids + list(profile.boundary(END).trailer_ids)
    assert stream != expected
    first = t.turns[0]
    think_open, think_close, blank = 151667, 151668, 271
    sampled = stream[first.sampled_start : first.sampled_end]
    start, stop = sampled.index(think_open), sampled.index(think_close) + 2
    assert sampled[stop - 1] == blank
    assert r.decode(sampled[start:stop]) == "<think>\nBe polite.\n</think>\n\n"
    cut = first.sampled_start
    assert stream[: cut + start] + stream[cut + stop :] == expected
