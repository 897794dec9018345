"""Build rollouts with the token core and record what the engine saw, as a real rollout would."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_ext.check.inputs import EngineCall, EngineCalls, TrainerSample, trainer_sample_from_trajectory
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.trajectory import TokenTrajectory

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": []},
        },
    }
]
PROMPT = [{"role": "user", "content": "What is 1+1? Use the calculator."}]


def call(expression: str = "1+1", n: int = 1) -> dict[str, Any]:
    function = {"name": "calculator", "arguments": {"expression": expression}}
    return {"id": f"call{n:05d}", "type": "function", "function": function}


def tool_result(content: str = "2", n: int = 1) -> dict[str, Any]:
    return {"role": "tool", "content": content, "tool_call_id": f"call{n:05d}", "name": "calculator"}


@dataclass
class Turn:
    output_ids: Sequence[int]
    message: Mapping[str, Any]
    followup: Sequence[Mapping[str, Any]] = ()  # tool/user messages appended after this turn
    finish: str = "stop"
    logprobs: Sequence[float] | None = None  # default: a distinct value per token


@dataclass
class Rollout:
    trajectory: TokenTrajectory
    calls: list[EngineCall] = field(default_factory=list)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.trajectory.messages

    def sample(self, response_length: int | None = None) -> TrainerSample:
        return trainer_sample_from_trajectory(self.trajectory, response_length)


def run(
    renderer: ChatRenderer,
    turns: Sequence[Turn],
    prompt: Sequence[Mapping[str, Any]] = PROMPT,
    tools: Sequence[Mapping[str, Any]] | None = TOOLS,
) -> Rollout:
    """Drive a TokenTrajectory turn by turn, recording each engine call's prompt as returned to the engine (in an
    ``EngineCalls`` log, as verl_ext's loop records them; ``calls`` is a list of them, for tests to change)."""
    t = TokenTrajectory(renderer)
    rollout = Rollout(t)
    log = EngineCalls()
    prompt_ids = t.start(list(prompt), tools)
    for k, turn in enumerate(turns):
        out = list(turn.output_ids)
        distinct = [-0.01 * (k + 1) - 0.001 * i for i in range(len(out))]
        lps = list(turn.logprobs) if turn.logprobs is not None else distinct
        rollout.calls.append(log.record(prompt_ids, out, lps, turn.finish))
        t.add_sampled(out, lps, turn.finish, message=dict(turn.message))
        if turn.followup:
            prompt_ids = t.append_messages(list(turn.followup))
    t.finish()
    return rollout


IM_END = 151645  # Qwen's <|im_end|>


Pieces = list[tuple[str, list[int]]]


def pieces_by_kind(t: TokenTrajectory) -> Pieces:
    """The trajectory's stream as runs of one kind each (prompt, sampled, repair, context), in order: what a faulty
    loop would change is a piece, and ``naive`` builds the engine calls back from them."""
    pieces: Pieces = []
    for token, kind in zip(t.input_ids, t.kinds, strict=True):
        if pieces and pieces[-1][0] == kind.value:
            pieces[-1][1].append(int(token))
        else:
            pieces.append((kind.value, [int(token)]))
    return pieces


def naive(r: ChatRenderer, segments: Sequence[tuple[str, Sequence[int]]]) -> tuple[list[EngineCall], TrainerSample]:
    """A stream assembled piece by piece; each ("sampled", ids) piece is an engine call on all ids before it."""
    stream: list[int] = []
    calls: list[EngineCall] = []
    mask: list[int] = []
    for kind, ids in segments:
        if kind == "sampled":
            calls.append(EngineCall.of(stream, ids, [-0.5] * len(ids)))
        stream += ids
        mask += [int(kind == "sampled")] * len(ids)
    p = calls[0].output_start
    logprobs = [-0.5 if m else 0.0 for m in mask[p:]]
    return calls, TrainerSample.of(stream[:p], stream[p:], mask[p:], logprobs)


def qwen3_tool_context(r: ChatRenderer, content: str = "2", newline: str = "\n") -> list[int]:
    """The tool turn as a decode-and-concatenate loop appends it: plain encode, special text and all."""
    return r.encode(
        f"{newline}<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def qwen3_answer_turn(r: ChatRenderer, text: str = "The answer is 2.", think: str = "") -> list[int]:
    return [*r.encode(f"<think>\n{think}\n</think>\n\n{text}" if think else f"<think>\n\n</think>\n\n{text}"), IM_END]
