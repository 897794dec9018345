"""An allowed cause excuses only what it names: a dropped call, swapped calls or a changed argument in the message the
trainer's re-render uses is a defect in the call's turn, whatever else the turn holds.

Before this, ``reasoning_stripped`` ("sampled text the render shortens to a part of itself") took a message that
lost its second call for stripped thinking, on any turn of a template that strips reasoning (QwQ-32B, whose
generation prompt pre-fills ``<think>\\n``); the tool-call markers of a template whose generation prompt ends in
``<think>`` were not found (the probe's shared prefix cut ``<t`` off its first ``<tool_call>``), so swapped calls
went to the text verdict, which matched JSON objects in any order (``sampled_text_kept``). Now
``reasoning_stripped`` needs the dropped text to end in the turn's sampled reasoning (up to its last reasoning close),
and the text verdict holds calls in the order sampled.

Rollouts are built as ``verl_ext_tool_agent`` builds them (``loop_rollouts.build_loop_rollout``, verl's hermes parser)
from calls as models write them (``model_tool_calls.hermes_call``: 1-3 per turn, other spacing, key order,
separators), with and without a reasoning block before them, on Qwen3 (thinking on and off), QwQ-32B, Qwen2.5 and
Qwen2.5's ChatML template over the Mistral v0.3 tokenizer with only the turn markers added (``<tool_call>`` plain
text there). Unmutated: 0 defects; each mutation a defect in the mutated turn.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from loop_rollouts import build_loop_rollout, verl_parser
from model_tool_calls import LEADS, REASONING, hermes_call
from template_fixtures import tokenizer_with

from verl_ext.check import ConsistencyChecker
from verl_ext.check.policy import CheckPolicy
from verl_ext.core.call_reader import learn_call_reader
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer

# QwQ-32B's generation prompt pre-fills "<think>\n": a model continues the block it is in, or closes it at once.
PREFILLED_REASONING = ("", "I need the calculator.\n</think>\n\n", "\n</think>\n\n")
CASES = [
    pytest.param("qwen3", {}, REASONING, id="qwen3"),
    pytest.param("qwen3", {"enable_thinking": False}, ("",), id="qwen3-no-thinking"),
    pytest.param("qwq-32b", {}, PREFILLED_REASONING, id="qwq-32b"),
    pytest.param("qwen2.5", {}, REASONING, id="qwen2.5"),
    pytest.param("chatml-mistral", {}, REASONING, id="chatml-on-mistral-plain-markers"),
]


def case_renderer(renderer_for: Any, case: str, kwargs: dict[str, Any]) -> ChatRenderer:
    """The case's renderer: a shipped tokenizer's template, QwQ-32B's over Qwen3's tokenizer, or Qwen2.5's ChatML
    template over Mistral v0.3 with ``<|im_start|>``/``<|im_end|>`` added (its call markers stay plain text)."""
    from verl_ext.demo.run import shipped_tokenizers

    if case == "qwq-32b":
        path = shipped_tokenizers()["qwen3"] / "extra_templates" / "qwq-32b.jinja"
        return renderer_for("qwen3").with_chat_template(path.read_text(encoding="utf-8"))
    if case == "chatml-mistral":
        tok = tokenizer_with(shipped_tokenizers()["mistral-7b-v0.3"], ["<|im_start|>", "<|im_end|>"])
        return ChatRenderer(tok, chat_template=renderer_for("qwen2.5").chat_template)
    return renderer_for(case).with_template_kwargs(kwargs)


def _dropped(calls: list[dict[str, Any]]) -> None:
    del calls[1]


def _swapped(calls: list[dict[str, Any]]) -> None:
    calls[0]["function"], calls[1]["function"] = calls[1]["function"], calls[0]["function"]


def _changed(calls: list[dict[str, Any]]) -> None:
    f = calls[0]["function"]
    other = {"expression": "changed by the loop"}
    f["arguments"] = json.dumps(other) if isinstance(f["arguments"], str) else other


MUTATIONS = {"dropped call": (_dropped, 2), "swapped calls": (_swapped, 2), "changed argument": (_changed, 1)}


def _value(arguments: Any) -> Any:
    return json.loads(arguments) if isinstance(arguments, str) else arguments


@pytest.mark.parametrize(("case", "kwargs", "reasoning"), CASES)
def test_mutations_caught_in_their_turn_whatever_is_excused(renderer_for, case, kwargs, reasoning):
    r = case_renderer(renderer_for, case, kwargs)
    profile = probe_template(r)
    parser = verl_parser(r, profile)
    reader = learn_call_reader(r, profile).reader  # the loop reads with both (core.turn_parse), as here
    checker = ConsistencyChecker(r, profile, CheckPolicy(mode="warn"))
    close = min(profile.close_id_set)
    seen: dict[str, int] = dict.fromkeys(MUTATIONS, 0)

    @settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def caught(data):
        turns = data.draw(st.integers(1, 2))
        outputs, counts = [], []
        for _ in range(turns):
            calls = [data.draw(hermes_call()) for _ in range(data.draw(st.integers(1, 3)))]
            between = data.draw(st.sampled_from(["\n", "", "\n\n"]))
            text = data.draw(st.sampled_from(reasoning)) + data.draw(st.sampled_from(LEADS)) + between.join(calls)
            outputs.append([*r.encode(text), close])
            counts.append(len(calls))
        outputs.append([*r.encode("The answer is 3."), close])
        lr, rollout = build_loop_rollout(
            r, profile, parser, outputs, ["3", "4", "5"], max_parallel_calls=8, call_reader=reader
        )
        clean = checker.check_rollout(rollout, template_view=True)
        assert clean.engine_ok and clean.ok, [(f.cause.value, f.turn, f.detail) for f in clean.defects]
        at = [i for i, m in enumerate(rollout.messages) if m["role"] == "assistant"]
        turn = data.draw(st.integers(0, turns - 1))
        calls = rollout.messages[at[turn]].get("tool_calls") or []
        assert len(calls) == counts[turn], (counts, rollout.messages[at[turn]])
        name = data.draw(st.sampled_from(sorted(MUTATIONS)))
        mutate, needs = MUTATIONS[name]
        values = [(c["function"]["name"], _value(c["function"]["arguments"])) for c in calls]
        assume(len(calls) >= needs and (name != "swapped calls" or values[0] != values[1]))
        messages = copy.deepcopy([dict(m) for m in rollout.messages])
        mutate(messages[at[turn]]["tool_calls"])
        result = checker.check_rollout(dataclasses.replace(rollout, messages=tuple(messages)), template_view=True)
        seen[name] += 1
        found = [(f.cause.value, f.turn, f.allowed, f.detail[:160]) for f in result.findings]
        assert any(f.turn == turn and not f.allowed for f in result.findings), (name, turn, found)

    caught()
    assert all(seen.values()), f"{case}: a mutation class was never drawn: {seen}"
