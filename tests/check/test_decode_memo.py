"""The template view's rules and the findings' context decode through a per-check memo (``decode_memo.MemoDecode``):
the same findings, causes, details and texts as with every decode made afresh, on real rollouts whose every turn
draws findings; the memo answers as the renderer does for any ids; and a memo that answered a wrong text is caught."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from long_rollouts import templated_tool_rollout

from verl_ext.check import CheckPolicy, ConsistencyChecker, decode_memo
from verl_ext.check.decode_memo import MemoDecode
from verl_ext.core.probe import probe_template

# the bench's rows (bench/check_linear.py): each turn draws an allowed finding, several where calls are compact
HOW = {
    "empty think block": ("qwen3", {}, {"extra": {"reasoning_content": ""}}),
    "thinking off": ("qwen3", {"enable_thinking": False}, {}),
    "thinking + compact calls": ("qwen3", {}, {"extra": {"reasoning_content": "Let me see."}, "compact": True}),
    "user turns, thinking": ("qwen3", {}, {"extra": {"reasoning_content": "Let me add."}, "user_turns": True}),
    "qwen2.5 compact calls": ("qwen2.5", {}, {"compact": True}),
    "analysis each turn": ("gpt-oss", {}, {"extra": {"thinking": "Let me see."}, "answer_extra": False}),
    "compact calls": ("mistral-7b-v0.3", {}, {"compact": True}),
    "user turns (tool list moved)": ("mistral-7b-v0.3", {}, {"user_turns": True}),
}


def checked(renderer: Any, how: dict[str, Any], turns: int = 6) -> tuple[Any, ...]:
    """Every finding of the whole check of a templated tool rollout, as compared: each field of each finding."""
    profile = probe_template(renderer)
    rollout = templated_tool_rollout(renderer, profile, turns, **how)()
    checker = ConsistencyChecker(renderer, profile, policy=CheckPolicy(template_view_budget_s=None))
    result = checker.check_rollout(rollout, template_view=True)
    assert result.findings, "no finding: not the case the memo serves"
    return result.findings


@pytest.mark.parametrize("name", sorted(HOW))
def test_the_memoized_check_finds_what_the_check_decoding_afresh_finds(renderer_for, monkeypatch, name):
    family, kwargs, how = HOW[name]
    r = renderer_for(family).with_template_kwargs(kwargs)
    served = [0]
    memo_decode = MemoDecode.decode

    def counting(self: MemoDecode, ids: Any) -> str:
        served[0] += len(ids) <= decode_memo.MEMO_MAX_IDS and tuple(ids) in self._texts
        return memo_decode(self, ids)

    with monkeypatch.context() as m:
        m.setattr(MemoDecode, "decode", counting)
        memoized = checked(r, how)
    with monkeypatch.context() as m:
        m.setattr(decode_memo, "MEMO_MAX_IDS", -1)  # every span longer than the memo takes: decoded afresh
        afresh = checked(r, how)
    assert memoized == afresh
    if "compact" in name or "thinking off" in name:
        assert served[0] > 0, "the memo served no repeated span on a rollout of several findings per turn"


def _stale(self: MemoDecode, ids: Any) -> str:
    """A memo keyed by the span's length alone: another span's text for a span of as many ids."""
    key = (len(ids),)
    if key not in self._texts:
        self._texts[key] = self.renderer.decode(ids)
    return self._texts[key]


def test_a_memo_answering_a_wrong_text_is_caught(renderer_for, monkeypatch):
    """Both comparisons can fail: a stale memo changes what the check reports on a rollout, and is told from the
    renderer's decode on ids."""
    family, kwargs, how = HOW["compact calls"]  # Mistral: its calls' JSON, decoded stale, no longer parses equal
    r = renderer_for(family).with_template_kwargs(kwargs)
    right = checked(r, how)
    with monkeypatch.context() as m:
        m.setattr(MemoDecode, "decode", _stale)
        assert not agrees(r, [[1, 2, 3], [4, 5, 6]])
        try:
            wrong = checked(r, how)
        except AssertionError:
            wrong = None
    assert wrong != right


def agrees(r: Any, spans: list[list[int]]) -> bool:
    """The memo decodes each span, asked twice, as the renderer does."""
    memo = MemoDecode(r)
    return all(memo.decode(ids) == r.decode(ids) for ids in [*spans, *spans])


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.lists(st.lists(st.integers(0, 150_000), max_size=600), min_size=1, max_size=6))
def test_the_memo_decodes_any_ids_as_the_renderer_does(renderer_for, spans):
    r = renderer_for("qwen3")
    assert agrees(r, spans)  # each span twice: the second answered from the memo where short enough
    memo = MemoDecode(r)
    assert memo.decode_joins == r.decode_joins and memo.control_ids == r.control_ids
