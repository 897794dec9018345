"""On canonical rollouts (each assistant turn sampled as the template renders it), the check finds no defect on
any shipped template, with thinking on and off; thinking off names the dropped pre-fill (issue 8, class 1)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest
from rollouts import TOOLS, call, tool_result
from template_fixtures import template_files, template_renderer

from verl_ext.check import Cause, ConsistencyChecker
from verl_ext.check.inputs import engine_calls_from_trajectory, trainer_sample_from_trajectory
from verl_ext.core.errors import TemplateError
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.replay import ReplayRecord, replay
from verl_ext.core.template_profile import END


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


def check_canonical(
    r: ChatRenderer,
    messages: list[dict[str, Any]],
    kwargs: dict[str, Any],
    sampled: dict[str, list[int]] | None = None,
) -> Any:
    record = {"messages": messages, "tools": TOOLS, "chat_template_kwargs": kwargs, "sampled": sampled}
    t = replay(r, ReplayRecord.from_json(record))
    checker = ConsistencyChecker(r.with_template_kwargs(kwargs))
    return checker.check(
        engine_calls_from_trajectory(t), trainer_sample_from_trajectory(t), t.messages, TOOLS, template_view=True
    )


# How a model continues a pre-filled thinking opener that the template never re-renders (its own format).
_AFTER_OPENER = {"<think>\n": "{reasoning}\n</think>\n\n", "<think>": "{reasoning}</think>"}


def thinking_outputs(
    r: ChatRenderer, messages: list[dict[str, Any]], kwargs: dict[str, Any], reasoning: str | None
) -> dict[str, list[int]]:
    """The engine's ids for each assistant message of a template that drops its own generation prompt's pre-fill:
    the model's thinking after the pre-filled text (nothing after a closed block: Seed-OSS with budget 0), then
    the turn as the template writes it."""
    rk = r.with_template_kwargs({**r.template_kwargs, **kwargs})
    end = probe_template(rk).boundary(END)
    messages = probe_template(rk).tool_call_shape.conform(messages)
    out: dict[str, list[int]] = {}
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = rk.render_text(messages[:i], TOOLS, add_generation_prompt=True)
        turn = rk.render_text(messages[: i + 1], TOOLS)
        n = next((k for k, (a, b) in enumerate(zip(prompt, turn, strict=False)) if a != b), min(len(prompt), len(turn)))
        if prompt.rfind("<", 0, n) > prompt.rfind(">", 0, n):
            n = prompt.rfind("<", 0, n)  # never split a tag: "<think>" against "</think>"
        text = _AFTER_OPENER.get(prompt[n:], "").format(reasoning=reasoning or "") + turn[n:]
        # Encoded after the prompt where that keeps the prompt's ids (SentencePiece adds no prefix space there), on
        # its own where the sampled text would merge with the pre-fill's last token ("<think>\n" + "\n").
        prompt_ids, ids = rk.encode(prompt), rk.encode(prompt + text)
        ids = ids[len(prompt_ids) :] if ids[: len(prompt_ids)] == prompt_ids else rk.encode(text)
        trailer = list(end.trailer_ids)
        out[str(i)] = ids[: -len(trailer)] if trailer and ids[-len(trailer) :] == trailer else ids
    return out


THINKING = [({}, None), ({}, ""), ({}, "Think."), ({"enable_thinking": False}, None), ({"enable_thinking": False}, "")]


@pytest.mark.parametrize("family", ["qwen3", "qwen2.5", "gpt-oss", "mistral-7b-v0.3"])
def test_shipped_templates_have_no_defect_on_canonical_rollouts(renderer_for, family):
    r = renderer_for(family)
    for kwargs, reasoning in THINKING:
        for name, messages in conversations(reasoning).items():
            result = check_canonical(r, messages, kwargs)
            assert result.ok, (kwargs, reasoning, name, [(f.cause.value, f.detail) for f in result.defects])


QWEN3_EXTRAS = (
    "qwen3-2504-original",
    "qwen3-coder-30b-a3b-instruct_ollama-gguf",
    "qwen3-next-80b-a3b-instruct_ollama-gguf",
    "qwq-32b",
)
# Fixture templates that write reasoning: the kwargs that turn thinking on, and off where they have a switch
# (test_every_thinking_template_is_covered keeps this list complete).
THINKING_TEMPLATES: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    "ByteDance-Seed-OSS": ({}, {"thinking_budget": 0}),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ({}, None),  # always thinks
    "deepseek-ai-DeepSeek-V3.1": ({"thinking": True}, {"thinking": False}),
    "ibm-granite-granite-3.3-2B-Instruct": ({"thinking": True}, {"thinking": False}),
}


def settings_for(on: dict[str, Any], off: dict[str, Any] | None) -> list[tuple[dict[str, Any], str | None]]:
    """(kwargs, reasoning) pairs: every kind of turn with thinking on; with it off, turns without reasoning."""
    return [(on, r) for r in (None, "", "Think.")] + ([(off, r) for r in (None, "")] if off is not None else [])


THINKS = re.compile(r"enable_thinking|thinking_budget|\bthinking\b|reasoning_content|<think>|think_begin")


def assert_no_defect_or_a_truthful_refusal(
    r: ChatRenderer, settings: Sequence[tuple[dict[str, Any], str | None]]
) -> int:
    """Every canonical rollout (each reasoning kind, thinking on and off) has no defect; where the template never
    re-renders its own generation prompt (a pre-filled "<think>\n" it drops), there is no canonical output: the replay
    says so, and the profile says the template re-renders the turn from the generation prompt on. Returns how many
    rollouts were checked."""
    checked = 0
    for kwargs, reasoning in settings:
        profile = probe_template(r.with_template_kwargs({**r.template_kwargs, **kwargs}))
        for name, messages in conversations(reasoning).items():
            if name in profile.unsupported_roles:
                continue
            try:
                result = check_canonical(r, messages, kwargs)
            except TemplateError as exc:
                assert "canonical output is undefined" in str(exc), exc
                end = profile.boundary(END)
                assert not end.prefix_preserving and "the generation prompt" in end.divergence, (kwargs, end)
                # What the model writes there instead: its thinking after the pre-filled opener, then the turn.
                result = check_canonical(r, messages, kwargs, sampled=thinking_outputs(r, messages, kwargs, reasoning))
            assert result.ok, (kwargs, reasoning, name, [(f.cause.value, f.detail) for f in result.defects])
            checked += 1
    return checked


@pytest.mark.parametrize("template", QWEN3_EXTRAS)
def test_extra_qwen_templates_have_no_defect_on_canonical_rollouts(load_tokenizer, qwen3_extra_templates, template):
    path = next(p for p in qwen3_extra_templates if p.stem == template)
    r = ChatRenderer(load_tokenizer("qwen3"), chat_template=path.read_text())
    assert_no_defect_or_a_truthful_refusal(r, THINKING)


@pytest.mark.parametrize("template", sorted(THINKING_TEMPLATES))
def test_thinking_fixture_templates_have_no_defect_on_canonical_rollouts(template):
    r = template_renderer(template)
    assert_no_defect_or_a_truthful_refusal(r, settings_for(*THINKING_TEMPLATES[template]))


def test_every_thinking_template_is_covered(qwen3_extra_templates):
    """Every shipped extra Qwen3 template and every fixture template that writes reasoning is checked above."""
    assert {p.stem for p in qwen3_extra_templates} == set(QWEN3_EXTRAS)
    thinking = {p.stem for p in template_files() if THINKS.search(p.read_text(encoding="utf-8"))}
    assert thinking == set(THINKING_TEMPLATES)


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


@pytest.mark.parametrize("template", ["qwq-32b", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"])
def test_reasoning_read_from_the_content_is_stripped_reasoning_not_a_defect(
    load_tokenizer, qwen3_extra_templates, template
):
    """QwQ and R1 pre-fill "<think>\\n" and keep only what follows "</think>" of an assistant's content: the probe
    says the template strips reasoning, and a thinking rollout's dropped thinking is `reasoning_stripped` (allowed),
    never `unknown` (which would stop a strict run)."""
    from rollouts import Turn, run

    path = next((p for p in qwen3_extra_templates if p.stem == template), None)
    r = ChatRenderer(load_tokenizer("qwen3"), chat_template=path.read_text()) if path else template_renderer(template)
    p = probe_template(r)
    assert p.strips_reasoning is True
    close = r.decode(p.boundary("user").close_ids)
    chat = conversations(None)["user"]
    turns = [
        Turn(r.encode(f"Think {k}.\n</think>\n\n{chat[k]['content']}{close}"), chat[k], [chat[k + 1]] if k == 1 else [])
        for k in (1, 3)
    ]
    ro = run(r, turns, prompt=chat[:1], tools=None)
    result = ConsistencyChecker(r, p).check(ro.calls, ro.sample(), ro.messages, template_view=True)
    assert result.engine_ok and not result.defects, [(f.cause.value, f.detail) for f in result.defects]
    assert Cause.REASONING_STRIPPED in result.cause_counts()
