"""Property tests: random conversations and random sampled ids keep every invariant, on every family."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from random_rollouts import FAMILIES, appended_messages, rollouts

from verl_ext.core.invariants import check_invariants
from verl_ext.core.trajectory import TokenKind, TokenTrajectory


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
        msgs, assistant = appended_messages(appends[k], texts[k:]) if k < len(appends) else ([], None)
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
