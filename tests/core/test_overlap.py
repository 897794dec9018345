"""Ambiguous stops (GLM's <|observation|>): a token that is both the engine's stop and the next message's opener.

No GLM tokenizer ships here, so this test writes a GLM-shaped template over Qwen3's special tokens: assistant
turns have no close, and a tool result opens with the token the model stops on.
"""

from __future__ import annotations

from synthetic_templates import ASSISTANT, GLM_SHAPED, OBSERVATION

from verl_ext.core.invariants import check_invariants
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_profile import END
from verl_ext.core.trajectory import RepairKind, TokenKind, TokenTrajectory


def test_sampled_ambiguous_stop_is_kept_once(load_tokenizer):
    r = ChatRenderer(load_tokenizer("qwen3"), chat_template=GLM_SHAPED)
    profile = probe_template(r)
    observation = r.encode(OBSERVATION)[0]
    assert profile.boundary(END).close_ids == ()  # the template never closes an assistant turn itself
    assert profile.boundary("tool").close_ids == (observation,)

    t = TokenTrajectory(r, profile)
    t.start([{"role": "user", "content": "1+1?"}])
    call = {"id": "call00001", "type": "function", "function": {"name": "calc", "arguments": {"e": "1+1"}}}
    sampled = [*r.encode('<tool_call>calc{"e": "1+1"}</tool_call>'), observation]
    t.add_sampled(sampled, [-0.25] * len(sampled), message={"role": "assistant", "content": "", "tool_calls": [call]})
    end = len(t.input_ids)
    t.append_messages([{"role": "tool", "content": "2", "tool_call_id": "call00001", "name": "calc"}])

    assert t.input_ids[end - 1] == observation and t.kinds[end - 1] is TokenKind.SAMPLED
    assert t.logprobs[end - 1] == -0.25  # the stop action keeps its gradient
    assert t.input_ids.count(observation) == 1  # not duplicated by the template's copy
    assert r.decode(t.input_ids[end:]) == "\n2" + ASSISTANT
    # the "\n" after the opener is never generated either: restored as a boundary repair (mask 0)
    assert [e.kind for e in t.edits] == [RepairKind.OVERLAP_KEPT, RepairKind.TRAILER]
    assert check_invariants(t).ok
