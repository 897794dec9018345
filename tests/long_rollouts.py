"""Long and repetitive Qwen3 rollouts (10k to 300k tokens) for the check's cost: built by the token core as a real
rollout would be, or assembled the way a decode-and-concatenate loop would; and many-turn tool rollouts on any
template whose turns are written as the template writes them (``templated_tool_rollout``). Used by
tests/check/test_align.py, tests/check/test_call_index.py, bench/check_long_rollouts.py and bench/check_linear.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

from rollouts import PROMPT, TOOLS, Turn, call, naive, qwen3_answer_turn, run, tool_result

from verl_ext.check.inputs import EngineCall, EngineCalls, TrainerSample, trainer_sample_from_trajectory
from verl_ext.check.record import Rollout
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.replay import canonical_output
from verl_ext.core.template_profile import TemplateProfile
from verl_ext.core.trajectory import TokenTrajectory

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


FINAL_ANSWER = "There are 42 crates in depot 7."


def compact_json(text: str) -> str:
    """A call's JSON as a model writes it without spaces (the template writes ``", "`` and ``": "``)."""
    for spaced, tight in (('", "', '","'), ('": "', '":"'), ('": {', '":{'), ('": [', '":[')):
        text = text.replace(spaced, tight)
    return text


def templated_tool_rollout(
    r: ChatRenderer,
    profile: TemplateProfile,
    turns: int,
    *,
    extra: Mapping[str, Any] | None = None,
    compact: bool = False,
    answer_extra: bool = True,
    results: Sequence[str] = ("2",),
    deltas: Any = None,
    user_turns: bool = False,
) -> Callable[[], Rollout]:
    """``turns`` calculator calls, each answered by a tool result of ``results`` (cycled), then an answer, every
    turn sampled as the template writes that message as the last one (``canonical_output`` of a one-turn history,
    renumbered per turn), reasoning blocks included: the template's history form of each turn then differs by what
    it drops (Qwen3's empty think block, GPT-OSS's analysis before a final answer). ``extra``: added to every call
    message (``reasoning_content``, ``thinking``), and to the answer with ``answer_extra``; ``compact``: each call's
    JSON sampled without spaces; ``user_turns``: each turn an answer followed by the next user question instead
    (Qwen3 drops each answered turn's thinking, Mistral moves its tool list to the last question). Recorded as the
    loop records it (an ``EngineCalls`` log, the trajectory's kinds); returns what makes the ``Rollout`` (a new one
    per call: it caches what a check reads of it)."""
    extra = dict(extra or {})
    answer = {"role": "assistant", "content": FINAL_ANSWER, **(extra if answer_extra else {})}
    ids_of = _templated_outputs(r, extra, compact, user_turns)
    final = canonical_output(r, [*PROMPT, answer], len(PROMPT), TOOLS)  # GPT-OSS drops analysis before an answer
    log = EngineCalls()
    t = TokenTrajectory(r, profile, deltas=deltas)
    prompt = t.start(PROMPT, TOOLS)
    for k in range(turns + 1):
        ids = ids_of(k) if k < turns else final
        log.record(prompt, ids, [-0.5] * len(ids), "stop")
        message, followup = _templated_turn(k, extra, results[k % len(results)], user_turns)
        t.add_sampled(ids, [-0.5] * len(ids), "stop", message=message if k < turns else answer)
        if k < turns:
            prompt = t.append_messages([followup])
    t.finish()
    sample = trainer_sample_from_trajectory(t)
    kinds, repairs, messages = t.kind_values(len(sample.stream)), Counter(e.kind.value for e in t.edits), t.messages
    return lambda: Rollout.of(log, sample, messages, TOOLS, prompt_messages=len(PROMPT), kinds=kinds, repairs=repairs)


def _templated_turn(
    k: int, extra: Mapping[str, Any], result: str, user_turns: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Turn ``k``'s assistant message and the message after it: a call and its result, or an answer and a question."""
    if user_turns:
        return {"role": "assistant", "content": f"It is {k + 1}.", **extra}, {
            "role": "user",
            "content": f"And {k + 1}+1?",
        }
    return {"role": "assistant", "content": "", "tool_calls": [call(f"{k}+1", k)], **extra}, tool_result(result, k)


def _templated_outputs(
    r: ChatRenderer, extra: Mapping[str, Any], compact: bool, user_turns: bool
) -> Callable[[int], list[int]]:
    """Turn ``k``'s sampled ids: turn 0's and turn 1's as the template writes them after a one-turn history, turn 1's
    renumbered for the later turns (a history of hundreds of turns would be rendered per turn)."""
    chat = [*PROMPT]
    for k in (0, 1):
        chat += _templated_turn(k, extra, "2", user_turns)
    first = canonical_output(r, chat, len(PROMPT), TOOLS)
    second = r.decode(canonical_output(r, chat, len(PROMPT) + 2, TOOLS))

    def ids_of(k: int) -> list[int]:
        if k == 0:
            ids = first
        elif user_turns:
            ids = r.encode(second.replace("It is 2.", f"It is {k + 1}."))
        else:
            ids = r.encode(second.replace('"1+1"', f'"{k}+1"').replace("call00001", f"call{k:05d}"))
        return r.encode(compact_json(r.decode(ids))) if compact else list(ids)

    return ids_of
