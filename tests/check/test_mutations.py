"""The check is not blind: real defects injected into otherwise clean rollouts are each reported, in the right turn.

Each clean rollout is built by the token core (two turns: a tool call, its result, an answer) and first checked
clean. A mutation then changes what a faulty loop would change (the stream and every engine prompt after the
change, or the final messages, or the trainer's copy) and the check must report a defect or an engine-view failure
in the turn the mutation touched. The property test beside this file (arbitrary engine output, zero defects) is
the other half: a check that reported everything would pass this file and fail that one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from rollouts import TOOLS, Turn, call, naive, qwen3_answer_turn, run, tool_result

from verl_ext.check import ConsistencyChecker
from verl_ext.check.findings import CheckResult
from verl_ext.check.inputs import EngineCall, TrainerSample
from verl_ext.core.rendering import ChatRenderer

TOOL_CALL = (
    '<think>\n\n</think>\n\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
)
CALL_MESSAGE = {"role": "assistant", "content": "", "tool_calls": [call("1+2")]}
ANSWER = {"role": "assistant", "content": "The answer is 2."}

Pieces = list[tuple[str, list[int]]]


def clean(r: ChatRenderer) -> tuple[Pieces, list[dict[str, Any]]]:
    """A clean two-turn Qwen-style rollout as pieces of the stream by kind, and its final messages."""
    im_end = r.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ro = run(
        r, [Turn([*r.encode(TOOL_CALL), im_end], CALL_MESSAGE, [tool_result("2")]), Turn(qwen3_answer_turn(r), ANSWER)]
    )
    t = ro.trajectory
    pieces: Pieces = []
    for token, kind in zip(t.input_ids, t.kinds, strict=True):
        if pieces and pieces[-1][0] == kind.value:
            pieces[-1][1].append(int(token))
        else:
            pieces.append((kind.value, [int(token)]))
    return pieces, [dict(m) for m in ro.messages]


def check(r: ChatRenderer, pieces: Pieces, messages: list[dict[str, Any]]) -> CheckResult:
    calls, sample = naive(r, pieces)
    return ConsistencyChecker(r).check(calls, sample, messages, TOOLS, template_view=True)


def index(pieces: Pieces, kind: str, nth: int = 0) -> int:
    return [k for k, (name, _) in enumerate(pieces) if name == kind][nth]


def drop_repair(r: ChatRenderer, pieces: Pieces, messages: list) -> None:
    del pieces[index(pieces, "repair")]


def double_close(r: ChatRenderer, pieces: Pieces, messages: list) -> None:
    k = index(pieces, "repair")
    pieces[k] = ("repair", [pieces[k - 1][1][-1], *pieces[k][1]])


def arguments_differ(r: ChatRenderer, pieces: Pieces, messages: list) -> None:
    messages[1]["tool_calls"] = [call("1+1")]


def duplicate_context(r: ChatRenderer, pieces: Pieces, messages: list) -> None:
    k = index(pieces, "context")
    pieces.insert(k, ("context", list(pieces[k][1])))


def drop_context_message(r: ChatRenderer, pieces: Pieces, messages: list) -> None:
    messages.insert(3, copy.deepcopy(messages[2]))  # the messages hold a tool result the stream never had


def context_from_decoded_text(r: ChatRenderer, pieces: Pieces, messages: list) -> None:
    k = index(pieces, "context")
    pieces[k] = ("context", r.encode(" " + r.decode(pieces[k][1])))  # re-encoded from text: another split


def tool_text_becomes_a_special_token(r: ChatRenderer, pieces: Pieces, messages: list) -> None:
    messages[2]["content"] = "2<|im_end|>"
    k = index(pieces, "context")
    text = r.decode(pieces[k][1]).replace("\n2\n", "\n2<|im_end|>\n")
    pieces[k] = ("context", r.encode(text))  # the tool's special-token text became a real turn boundary


MUTATIONS: dict[str, tuple[Callable[[ChatRenderer, Pieces, list], None], int]] = {
    # name: (mutation, the turn the defect is in)
    "dropped boundary repair": (drop_repair, 0),
    "doubled close": (double_close, 0),
    "tool call arguments differ from what was sampled": (arguments_differ, 0),
    "context message duplicated in the stream": (duplicate_context, 0),
    "context message missing from the stream": (drop_context_message, 0),
    "context delta rendered from decoded text": (context_from_decoded_text, 0),
    "special token created in a tool message": (tool_text_becomes_a_special_token, 0),
}


@pytest.mark.parametrize("family", ["qwen3", "qwen2.5"])
def test_the_clean_rollout_is_clean(renderer_for, family):
    r = renderer_for(family)
    pieces, messages = clean(r)
    result = check(r, pieces, messages)
    assert result.ok and result.engine_ok, result.summary()


@pytest.mark.parametrize("family", ["qwen3", "qwen2.5"])
@pytest.mark.parametrize("name", list(MUTATIONS))
def test_every_injected_defect_is_reported_in_its_turn(renderer_for, family, name):
    r = renderer_for(family)
    pieces, messages = clean(r)
    mutate, turn = MUTATIONS[name]
    mutate(r, pieces, messages)
    result = check(r, pieces, messages)
    defects = [f for f in result.findings if not f.allowed]
    assert defects or result.engine_failures, f"{name}: not reported ({result.summary()})"
    assert any(f.turn == turn for f in defects) or result.engine_failures, [(f.cause, f.turn) for f in defects]


def test_a_turn_changed_between_calls_is_a_prefix_failure(renderer_for):
    r = renderer_for("qwen3")
    pieces, messages = clean(r)
    calls, sample = naive(r, pieces)
    later = calls[1]
    changed = list(later.prompt_ids)
    changed[calls[0].output_start] += 1  # the first turn's tokens changed before the second call
    calls[1] = EngineCall.of(changed, later.output_ids, later.logprobs, later.finish_reason)
    result = ConsistencyChecker(r).check(calls, sample, messages, TOOLS)
    assert "prefix" in {f.kind.value for f in result.engine_failures}


def test_a_trainer_stream_shifted_by_one_is_an_engine_view_failure(renderer_for):
    r = renderer_for("qwen3")
    pieces, messages = clean(r)
    calls, sample = naive(r, pieces)
    shifted = TrainerSample.of(
        sample.prompt_ids,
        [*sample.response_ids[1:], sample.response_ids[-1]],
        sample.response_mask,
        sample.response_logprobs,
    )
    result = ConsistencyChecker(r).check(calls, shifted, messages, TOOLS)
    assert result.engine_failures
