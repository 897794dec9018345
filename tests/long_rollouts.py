"""Long and repetitive Qwen3 rollouts (10k to 300k tokens) for the check's cost: built by the token core as a real
rollout would be, or assembled the way a decode-and-concatenate loop would. Used by tests/check/test_align.py and
bench/check_long_rollouts.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

from rollouts import PROMPT, TOOLS, Turn, call, naive, qwen3_answer_turn, run, tool_result

from verl_ext.check.inputs import EngineCall, TrainerSample
from verl_ext.core.rendering import ChatRenderer

IM_END = 151645
ROW = "| 2024-01-01 | sensor-7 | ok | 0.000 | 0.000 |\n"  # a log line a tool repeats thousands of times
ANSWER = {"role": "assistant", "content": "The answer is 2."}


def difflib_alignment(a: list[int], b: list[int]) -> list[tuple[str, int, int, int, int]]:
    """The check's alignment before verl_ext.check.align: trim the common prefix and suffix, difflib on the middle.
    The reference the fast alignment is tested against, and the baseline the benchmark times."""
    n = min(len(a), len(b))
    lo = 0
    while lo < n and a[lo] == b[lo]:
        lo += 1
    hi = 0
    while hi < n - lo and a[len(a) - 1 - hi] == b[len(b) - 1 - hi]:
        hi += 1
    ops = [("equal", 0, lo, 0, lo)] if lo else []
    middle = SequenceMatcher(None, a[lo : len(a) - hi], b[lo : len(b) - hi], autojunk=False).get_opcodes()
    ops += [(tag, i1 + lo, i2 + lo, j1 + lo, j2 + lo) for tag, i1, i2, j1, j2 in middle]
    if hi:
        ops.append(("equal", len(a) - hi, len(a), len(b) - hi, len(b)))
    return ops


@dataclass(frozen=True)
class LongRollout:
    name: str
    calls: list[EngineCall]
    sample: TrainerSample
    messages: list[dict[str, Any]]

    @property
    def tokens(self) -> int:
        return len(self.sample.stream)


def _rows(r: ChatRenderer, tokens: int) -> str:
    return ROW * max(1, tokens // len(r.encode(ROW)))


def _call_text(k: int) -> str:
    return f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{k}+1"}}}}\n</tool_call>'


def _call_message(k: int) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [call(f"{k}+1", k + 1)]}


def repetitive_tool_output(r: ChatRenderer, tokens: int, turns: int = 4) -> LongRollout:
    """The token core's rollout: ``turns`` tool calls whose results repeat one log line, then an answer. The first
    call is sampled in an unusual split (``bpe_remerge`` at its start): a divergence at the very beginning, so
    nothing after it can be trimmed as a common prefix."""
    content = _rows(r, tokens // turns)
    split = [t for piece in ['<tool_call>\n{"na', _call_text(0)[len('<tool_call>\n{"na') :]] for t in r.encode(piece)]
    steps = [
        Turn([*(split if k == 0 else r.encode(_call_text(k))), IM_END], _call_message(k), [tool_result(content, k + 1)])
        for k in range(turns)
    ]
    ro = run(r, [*steps, Turn(qwen3_answer_turn(r), ANSWER)])
    return LongRollout("repetitive tool output (core loop)", ro.calls, ro.sample(), ro.messages)


def naive_repetitive(r: ChatRenderer, tokens: int, turns: int = 8) -> LongRollout:
    """A decode-and-concatenate loop: every tool turn lacks the template's "\\n" after ``<|im_end|>``
    (``boundary_missing`` at each of ``turns`` boundaries), between tool results that repeat one line."""
    content = _rows(r, tokens // turns)
    segments: list[tuple[str, list[int]]] = [("prompt", r.render(PROMPT, TOOLS, add_generation_prompt=True).ids)]
    messages: list[dict[str, Any]] = [*PROMPT]
    for k in range(turns):
        result = f"<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        segments += [("sampled", [*r.encode(_call_text(k)), IM_END]), ("context", r.encode(result))]
        messages += [_call_message(k), tool_result(content, k + 1)]
    segments.append(("sampled", qwen3_answer_turn(r)))
    messages.append(ANSWER)
    calls, sample = naive(r, segments)
    return LongRollout("repetitive, decode-and-concatenate loop", calls, sample, messages)


def stripped_reasoning(r: ChatRenderer, tokens: int, turns: int = 6) -> LongRollout:
    """A chat over ``turns`` user questions, each answered after long, repetitive thinking. Qwen3's template drops
    the thinking of every answer before the last question (``reasoning_stripped``): large gaps in the re-render."""
    thought = "Let me recount the rows once more. " * max(1, tokens // (turns * 9))
    steps = []
    for k in range(turns):
        text = f"{k}+1 = {k + 1}."
        message = {"role": "assistant", "content": text, "reasoning_content": thought}
        followup = [{"role": "user", "content": f"And {k + 1}+1?"}] if k + 1 < turns else []
        steps.append(Turn(qwen3_answer_turn(r, text, thought), message, followup))
    ro = run(r, steps, prompt=[{"role": "user", "content": "What is 0+1?"}], tools=None)
    return LongRollout("long thinking the template strips", ro.calls, ro.sample(), ro.messages)


def one_huge_tool_result(r: ChatRenderer, tokens: int) -> LongRollout:
    """One tool call, one tool result of about ``tokens`` repeated lines, an answer (``bpe_remerge`` in the
    first call, as in ``repetitive_tool_output``)."""
    one = repetitive_tool_output(r, tokens, turns=1)
    return LongRollout("one huge tool result (core loop)", one.calls, one.sample, one.messages)


SCENARIOS: dict[str, Callable[[ChatRenderer, int], LongRollout]] = {
    "repetitive": repetitive_tool_output,
    "naive": naive_repetitive,
    "stripped": stripped_reasoning,
    "one_result": one_huge_tool_result,
}
