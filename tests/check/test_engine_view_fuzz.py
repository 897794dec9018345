"""Over random rollouts on every shipped tokenizer: the engine view never fails on what the token core
built, and catches each deliberate corruption of the trainer's sample."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from random_rollouts import FAMILIES, appended_messages, rollouts
from rollouts import Rollout, Turn, run

from verl_ext.check import ConsistencyChecker, FailureKind, TrainerSample
from verl_ext.core.trajectory import RepairKind, TokenKind


def random_rollout(r, family: str, data: st.DataObject) -> Rollout:
    turns, finishes, appends, texts = data.draw(rollouts(len(r.tokenizer), sorted(r.special_ids)[:50]))
    script = []
    for k, (ids, finish) in enumerate(zip(turns, finishes, strict=True)):
        if k < len(appends) and appends[k] == "user" and family == "mistral-7b-v0.3":
            appends[k] = "tool"  # Mistral's template refuses a user turn right after an assistant turn with tools
        msgs, assistant = appended_messages(appends[k], texts[k:]) if k < len(appends) else ([], None)
        script.append(Turn(ids, assistant or {"role": "assistant", "content": "x"}, msgs, finish))
    return run(r, script, prompt=[{"role": "user", "content": texts[0] or "hi"}], tools=None)


def failures(checker: ConsistencyChecker, ro: Rollout, sample: TrainerSample) -> set[FailureKind]:
    result = checker.check(ro.calls, sample, ro.messages, template_view=False)
    return {f.kind for f in result.engine_failures}


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_engine_view_passes_core_rollouts_and_catches_corruptions(renderer_for, family, data):
    r = renderer_for(family)
    ro = random_rollout(r, family, data)
    checker = ConsistencyChecker(r)
    sample = ro.sample()
    result = checker.check(ro.calls, sample, ro.messages)  # template view too: it must not crash either
    assert result.engine_ok, result.engine_failures
    assert not result.truncated

    t = ro.trajectory
    p = len(sample.prompt_ids)
    resp = list(sample.response_ids)
    kinds = t.kinds[p:]

    # 1. a dropped boundary token (Qwen's "\n" after <|im_end|>): the trainer's stream is not the engine's
    boundary = [e for e in t.edits if e.kind is RepairKind.TRAILER and e.position < len(t.input_ids) - 1]
    if boundary:
        i = boundary[0].position - p
        dropped = TrainerSample.of(
            sample.prompt_ids, resp[:i] + resp[i + 1 :], sample.response_mask[:i] + sample.response_mask[i + 1 :]
        )
        assert FailureKind.STREAM in failures(checker, ro, dropped)

    # 2. a re-tokenized assistant turn (decode, then encode again)
    turn = data.draw(st.sampled_from(t.turns))
    a, b = turn.sampled_start - p, turn.sampled_end - p
    again = r.encode(r.decode(resp[a:b]))
    if again != resp[a:b]:
        ids = resp[:a] + again + resp[b:]
        mask = list(sample.response_mask[:a]) + [1] * len(again) + list(sample.response_mask[b:])
        assert failures(checker, ro, TrainerSample.of(sample.prompt_ids, ids, mask)) & {
            FailureKind.STREAM,
            FailureKind.MASK,
        }

    # 3. logprobs shifted by one position
    lps = list(sample.response_logprobs or [])
    sampled_at = [i for i, m in enumerate(sample.response_mask) if m]
    assume(len(sampled_at) >= 2)
    shifted = TrainerSample.of(sample.prompt_ids, resp, sample.response_mask, [0.0, *lps[:-1]])
    assert FailureKind.LOGPROB in failures(checker, ro, shifted)

    # 4. loss mask 1 on a tool (context) token
    context = [i for i, k in enumerate(kinds) if k is TokenKind.CONTEXT]
    if context:
        mask = list(sample.response_mask)
        mask[data.draw(st.sampled_from(context))] = 1
        assert failures(checker, ro, dataclasses.replace(sample, response_mask=tuple(mask))) == {FailureKind.MASK}


def test_truncation_is_reported_not_failed(renderer_for):
    r = renderer_for("qwen3")
    text = r.encode("<think>\n\n</think>\n\nThe answer is 2, as the calculator said.")
    ro = run(r, [Turn([*text, 151645], {"role": "assistant", "content": "The answer is 2."})], tools=None)
    full = ro.sample()
    cut = ro.sample(response_length=len(full.response_ids) - 5)
    result = ConsistencyChecker(r).check(ro.calls, cut, ro.messages)
    assert result.engine_ok and result.truncated and result.lost_sampled_tokens == 5
    assert "truncated (5 sampled tokens lost)" in result.summary()


def test_the_engine_view_marks_exactly_the_sampled_positions(renderer_for):
    from verl_ext.check.engine_view import check_engine_view

    r = renderer_for("qwen3")
    answer = r.encode("The answer is 2.")
    ro = run(r, [Turn([*answer, 151645], {"role": "assistant", "content": "The answer is 2."})], tools=None)
    view = check_engine_view(ro.calls, ro.sample(), 1e-5)
    start, end = ro.calls[0].output_start, ro.calls[0].output_end
    assert view.sampled == tuple(start <= i < end for i in range(len(view.engine_stream)))
    assert view.sampled_bytes == bytes(start <= i < end for i in range(len(view.engine_stream)))
