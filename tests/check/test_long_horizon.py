"""A 1,000-turn rollout recorded as verl_ext's loop records it (``EngineCalls``: each call keeps only what its
prompt adds) is checked exactly as strictly as one whose every prompt was copied whole: a prompt that differs from
the stream at any position, in the first, a middle or the last call, is a ``prefix`` failure naming that call and
that position. The rollout is built once for the module (about a second)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from rollouts import IM_END, PROMPT, TOOLS, call, tool_result

from verl_ext.check.engine_view import check_engine_view
from verl_ext.check.findings import FailureKind
from verl_ext.check.inputs import EngineCall, EngineCalls, TrainerSample, trainer_sample_from_trajectory
from verl_ext.check.record import Rollout
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.trajectory import TokenTrajectory

TURNS = 1000


@dataclass
class Long:
    calls: EngineCalls
    sample: TrainerSample
    trajectory: TokenTrajectory


@pytest.fixture(scope="module")
def long(renderer_for: Callable[[str], ChatRenderer]) -> Long:
    r = renderer_for("qwen3")
    t = TokenTrajectory(r)
    calls = EngineCalls()
    prompt = t.start(list(PROMPT), TOOLS)
    for k in range(TURNS):
        text = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{k}+1"}}}}\n</tool_call>'
        out = [*r.encode(text), IM_END]
        lps = [-0.5] * len(out)
        message = {"role": "assistant", "content": "", "tool_calls": [call(f"{k}+1", k + 1)]}
        calls.record(prompt, out, lps, "stop")
        t.add_sampled(out, lps, "stop", message=message)
        prompt = t.append_messages([tool_result(str(k + 2), k + 1)])
    answer = [*r.encode("<think>\n\n</think>\n\nDone."), IM_END]
    calls.record(prompt, answer, [-0.5] * len(answer), "stop")
    t.add_sampled(answer, [-0.5] * len(answer), "stop", message={"role": "assistant", "content": "Done."})
    t.finish()
    return Long(calls, trainer_sample_from_trajectory(t), t)


def _view(calls: Any, sample: TrainerSample) -> Any:
    return check_engine_view(calls, sample, 1e-6)


def test_the_log_keeps_each_prompt_as_what_it_adds(long: Long) -> None:
    calls, stream = long.calls, tuple(long.trajectory.input_ids)
    assert len(calls) == TURNS + 1 and _view(calls, long.sample).failures == ()
    kept = sum(len(c.tail) for c in calls)
    assert kept == calls[-1].prompt_length - sum(len(c.output_ids) for c in calls[:-1])  # each id once
    for k in (0, 1, TURNS // 2, TURNS):  # and every prompt is still the stream's prefix, id for id
        assert calls[k].prompt_ids == stream[: calls[k].prompt_length]
        assert calls[k] == EngineCall.of(stream[: calls[k].prompt_length], calls[k].output_ids, calls[k].logprobs)
    assert Rollout.of(calls, long.sample, long.trajectory.messages, TOOLS).record is not None


@pytest.mark.parametrize("k", [1, TURNS // 2, TURNS], ids=["turn 1", "middle turn", "last turn"])
@pytest.mark.parametrize("where", ["first id", "middle", "last id"])
def test_a_prompt_that_differs_anywhere_is_a_prefix_failure_naming_its_call_and_position(
    long: Long, k: int, where: str
) -> None:
    """Call k's prompt as a faulty loop would have sent it (one id changed), the other calls as recorded: the
    engine view names call k and the changed position, and no other call."""
    prompt = list(long.calls[k].prompt_ids)
    at = {"first id": 0, "middle": len(prompt) // 2, "last id": len(prompt) - 1}[where]
    prompt[at] = prompt[at] + 1
    calls = list(long.calls)
    before = calls[k]
    calls[k] = EngineCall.of(prompt, before.output_ids, before.logprobs, before.finish_reason)
    failures = _view(calls, long.sample).failures
    prefix = {(f.turn, f.position) for f in failures if f.kind is FailureKind.PREFIX}
    if k == TURNS:
        # The last call's prompt + output is the engine's final stream: the trainer's stream departs from it at the
        # changed id, and so does every earlier call that reaches that position (as with prompts copied whole).
        assert (FailureKind.STREAM, at) in {(f.kind, f.position) for f in failures}
        assert prefix == {(j, at) for j in range(k) if calls[j].output_end > at}
        return
    assert prefix == {(k, at)}


@pytest.mark.parametrize("k", [1, TURNS // 2, TURNS - 1], ids=["turn 1", "middle turn", "second to last turn"])
def test_a_recorded_prompt_that_departs_is_kept_and_fails_where_it_departs(long: Long, k: int) -> None:
    """The log itself, fed call k's prompt changed at one position (a stock loop's re-tokenized history): the log
    keeps the call from where it departs, and the engine view names call k at that position; the calls after it,
    recorded from the real stream again, pass."""
    stream = list(long.trajectory.input_ids)
    calls = EngineCalls()
    at = None
    for j, c in enumerate(long.calls):
        prompt = stream[: c.prompt_length]
        if j == k:
            at = c.prompt_length * 2 // 3
            prompt[at] += 1
        calls.record(prompt, c.output_ids, c.logprobs, c.finish_reason)
    assert calls[k].shared == at and calls[k + 1].shared == at  # the next call keeps its ids from there on
    failures = _view(calls, long.sample).failures
    assert [(f.turn, f.position) for f in failures if f.kind is FailureKind.PREFIX] == [(k, at)]
    assert {f.kind for f in failures} == {FailureKind.PREFIX, FailureKind.MASK}  # its output: not the engine's


def test_an_output_changed_after_the_engine_returned_it_fails_in_its_call(long: Long) -> None:
    """The trainer's stream holds call k's output as sampled, the record another id there: call k fails at it."""
    k = TURNS // 2
    c = long.calls[k]
    out = list(c.output_ids)
    out[1] += 1
    calls = list(long.calls)
    calls[k] = EngineCall(c.tail, tuple(out), c.logprobs, c.finish_reason, after=c.after, shared=c.shared)
    failures = _view(calls, long.sample).failures
    assert [(f.kind, f.turn, f.position) for f in failures if f.kind is FailureKind.PREFIX][:1] == [
        (FailureKind.PREFIX, k, c.output_start + 1)
    ]


def test_every_recorded_prompt_is_what_was_sent_however_it_came() -> None:
    """Prompts as a trajectory's view, as lists that extend, re-tokenize or shrink the previous one, as ids past 32
    bits, and a call appended from another log (a gateway fork): each call rebuilds exactly the prompt it was
    given, and equals the call ``EngineCall.of`` builds from that prompt whole."""
    from verl_ext.core.prompt_ids import PromptIds

    stream: list[int] = [1, 2, 3]
    sent: list[list[int]] = []
    calls = EngineCalls()

    def record(prompt: Any, out: list[int]) -> None:
        sent.append(list(prompt))
        calls.record(prompt, out, [-0.5] * len(out), "stop")

    record(PromptIds(stream), [4, 5])
    stream += [4, 5, 9]
    record(PromptIds(stream), [6])  # the view fast path: only [9] is read
    stream += [6, 7]
    record(list(stream), [8])  # a list that extends
    calls.next_call([*stream[:4], 99, 98, 97], [1])  # built, never appended (a turn the gateway did not keep)
    record([*stream[:4], 99, 98], [8])  # re-tokenized from position 4
    record([1, 2], [])  # shorter than everything before
    record([1, 2, 2**40], [2**33])  # ids past 32 bits
    other = EngineCalls()
    for c in calls:
        other.append(c)  # a fork replays the parent's calls, then records its own
    other.record([1, 2, 2**40, 2**33, 5], [3])
    sent.append([1, 2, 2**40, 2**33, 5])
    for c, prompt in zip([*calls, other[-1]], sent, strict=True):
        assert c.prompt_ids == tuple(prompt)
        assert c == EngineCall.of(prompt, c.output_ids, c.logprobs, c.finish_reason)
    assert [c.shared for c in calls] == [0, 5, 7, 4, 2, 2]
