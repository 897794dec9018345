"""On canonical rollouts (each assistant turn sampled as the template renders it), the check finds no defect on
any shipped template, with thinking on and off; thinking off names the dropped pre-fill (issue 8, class 1)."""

from __future__ import annotations

from typing import Any

import pytest
from rollouts import TOOLS, call, tool_result

from verl_ext.check import Cause, ConsistencyChecker, EngineCall
from verl_ext.check.inputs import trainer_sample_from_trajectory
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.replay import ReplayRecord, replay
from verl_ext.core.trajectory import TokenTrajectory


def conversations(reasoning: str | None) -> dict[str, list[dict[str, Any]]]:
    extra = {} if reasoning is None else {"reasoning_content": reasoning}
    return {
        "tool": [
            {"role": "user", "content": "What is 1+1?"},
            {"role": "assistant", "content": "", **extra, "tool_calls": [call()]},
            tool_result(),
            {"role": "assistant", "content": "1+1 = 2.", **extra},
        ],
        "user": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", **extra},
            {"role": "user", "content": "Bye"},
            {"role": "assistant", "content": "Bye!", **extra},
        ],
    }


def engine_calls(t: TokenTrajectory) -> list[EngineCall]:
    return [
        EngineCall.of(
            t.input_ids[: turn.prompt_length],
            t.input_ids[turn.sampled_start : turn.sampled_end],
            t.logprobs[turn.sampled_start : turn.sampled_end],
            turn.finish_reason.value if turn.finish_reason else "stop",
        )
        for turn in t.turns
    ]


def check_canonical(r: ChatRenderer, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> Any:
    t = replay(r, ReplayRecord.from_json({"messages": messages, "tools": TOOLS, "chat_template_kwargs": kwargs}))
    checker = ConsistencyChecker(r.with_template_kwargs(kwargs))
    return checker.check(engine_calls(t), trainer_sample_from_trajectory(t), t.messages, TOOLS, template_view=True)


THINKING = [({}, None), ({}, ""), ({}, "Think."), ({"enable_thinking": False}, None), ({"enable_thinking": False}, "")]


@pytest.mark.parametrize("family", ["qwen3", "qwen2.5", "gpt-oss", "mistral-7b-v0.3"])
def test_shipped_templates_have_no_defect_on_canonical_rollouts(renderer_for, family):
    r = renderer_for(family)
    for kwargs, reasoning in THINKING:
        for name, messages in conversations(reasoning).items():
            result = check_canonical(r, messages, kwargs)
            assert result.ok, (kwargs, reasoning, name, [(f.cause.value, f.detail) for f in result.defects])


@pytest.mark.parametrize(
    "template",
    ["qwen3-2504-original", "qwen3-coder-30b-a3b-instruct_ollama-gguf", "qwen3-next-80b-a3b-instruct_ollama-gguf"],
)
def test_extra_qwen_templates_have_no_defect_on_canonical_rollouts(load_tokenizer, qwen3_extra_templates, template):
    path = next(p for p in qwen3_extra_templates if p.stem == template)
    r = ChatRenderer(load_tokenizer("qwen3"), chat_template=path.read_text())
    for kwargs, reasoning in THINKING:
        for name, messages in conversations(reasoning).items():
            result = check_canonical(r, messages, kwargs)
            assert result.ok, (kwargs, reasoning, name, [(f.cause.value, f.detail) for f in result.defects])


def test_thinking_off_names_the_dropped_empty_think_block(renderer_for):
    """Qwen3, enable_thinking=False: the generation prompt pre-fills "<think>\\n\\n</think>\\n\\n"; the template
    drops it once a user turn follows. That is `prefill_dropped` (allowed), at the pre-fill, not `unknown`."""
    r = renderer_for("qwen3")
    result = check_canonical(r, conversations(None)["user"], {"enable_thinking": False})
    (f,) = result.findings
    assert f.cause is Cause.PREFILL_DROPPED and f.allowed and result.ok
    assert f.stream_text == "<think>\n\n</think>\n\n" and f.rendered_text == "" and f.turn == 0
    # the dropped block is the end of the prompt the engine saw for turn 0, right before its output
    record = {
        "messages": conversations(None)["user"],
        "tools": TOOLS,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    t = replay(r, ReplayRecord.from_json(record))
    assert f.stream.end == t.turns[0].sampled_start


def test_thinking_on_empty_reasoning_is_stripped_reasoning_not_a_defect(renderer_for):
    r = renderer_for("qwen3")
    result = check_canonical(r, conversations("")["tool"], {})
    assert result.ok and [f.cause for f in result.findings] == [Cause.REASONING_STRIPPED]
    assert result.findings[0].stream_text == "<think>\n\n</think>\n\n" and result.findings[0].region == "sampled"
