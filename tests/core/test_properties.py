"""Property tests: random conversations and random sampled ids keep every invariant, on every family."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_ext.core.invariants import check_invariants
from verl_ext.core.trajectory import TokenKind, TokenTrajectory

FAMILIES = ("qwen3", "qwen2.5", "gpt-oss", "mistral-7b-v0.3")
TEXT = st.lists(
    st.sampled_from([*'ab c{}"\n  é中🙂<|>/', "<|im_end|>", "</s>", "<|end|>", "<tool_call>"]), max_size=12
).map("".join)


@st.composite
def rollouts(draw, vocab_size: int, special_ids: list[int]):
    """(turns, finish reasons, appended roles): sampled ids mix text ids, special ids and empty turns."""
    n_turns = draw(st.integers(1, 4))
    token = st.one_of(st.integers(0, vocab_size - 1), st.sampled_from(special_ids))
    turns = [draw(st.lists(token, max_size=12)) for _ in range(n_turns)]
    finishes = [draw(st.sampled_from(["stop", "length"])) for _ in range(n_turns)]
    appends = [draw(st.sampled_from(["tool", "tool2", "user"])) for _ in range(n_turns - 1)]
    texts = [draw(TEXT) for _ in range(n_turns * 2)]
    return turns, finishes, appends, texts


CALL = {"id": "call00001", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "1"}}}


def _messages(kind: str, texts: list[str]) -> tuple[list[dict], dict]:
    tool = {"role": "tool", "tool_call_id": "call00001", "name": "calculator"}
    if kind == "tool":
        return [{**tool, "content": texts[0]}], {"role": "assistant", "content": "", "tool_calls": [CALL]}
    if kind == "tool2":
        calls = [CALL, {**CALL, "id": "call00002"}]
        msgs = [{**tool, "content": texts[0]}, {**tool, "content": texts[1], "tool_call_id": "call00002"}]
        return msgs, {"role": "assistant", "content": "", "tool_calls": calls}
    return [{"role": "user", "content": texts[0] or "ok"}], {"role": "assistant", "content": "x"}


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_invariants_hold_on_random_rollouts(renderer_for, family, data):
    r = renderer_for(family)
    turns, finishes, appends, texts = data.draw(rollouts(len(r.tokenizer), sorted(r.special_ids)[:50]))
    t = TokenTrajectory(r)
    t.start([{"role": "user", "content": texts[0] or "hi"}])
    for k, (ids, finish) in enumerate(zip(turns, finishes, strict=True)):
        logprobs = [-0.5] * len(ids)
        if k < len(appends) and appends[k] == "user" and family == "mistral-7b-v0.3":
            appends[k] = "tool"  # Mistral's template refuses a user turn right after an assistant turn with tools
        msgs, assistant = _messages(appends[k], texts[k:]) if k < len(appends) else ([], None)
        t.add_sampled(ids, logprobs, finish, message=assistant)
        turn = t.turns[-1]  # sampled ids are kept verbatim, with their logprobs
        assert t.input_ids[turn.sampled_start : turn.sampled_end] == ids
        assert t.logprobs[turn.sampled_start : turn.sampled_end] == logprobs
        if msgs:
            assert t.append_messages(msgs) == t.input_ids
    t.finish()
    report = check_invariants(t)
    assert report.ok, report.failures
    assert sum(t.loss_mask) == sum(len(ids) for ids in turns)
    assert all(t.kinds[i] is TokenKind.SAMPLED for i in range(len(t.kinds)) if t.loss_mask[i])
