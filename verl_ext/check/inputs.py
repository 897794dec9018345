"""What the check compares: the engine's record of a rollout and the trainer's view of it.

Both are plain ids, independent of how the rollout built its tokens, so the same check audits
verl_ext's own agent loop and any other (verl's stock ``tool_agent`` included).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.core.errors import TrajectoryError
from verl_ext.core.prompt_ids import PromptIds
from verl_ext.core.trajectory import TokenTrajectory


def _as_ints(values: Sequence[Any]) -> tuple[int, ...]:
    """``values`` as a tuple of ints (``int(v)`` each: numpy ints, bools and the like converted). An agent loop
    builds an ``EngineCall`` per engine call with the whole prompt, so this runs at C speed: the common input (ints
    already) is copied and its types checked without a Python-level loop; anything else is converted with ``map``. A
    trajectory's ``PromptIds`` holds plain ints by contract (``check_invariants`` verifies it): copied, not scanned,
    so the agent loop's per-turn record of the prompt costs a copy instead of a type scan of the whole stream."""
    if isinstance(values, PromptIds):
        return tuple(values)
    out = tuple(values)
    return out if _only(out, int) else tuple(map(int, out))


def _as_floats(values: Sequence[Any]) -> tuple[float, ...]:
    """``values`` as a tuple of floats (``float(v)`` each), at C speed as ``_as_ints``."""
    out = tuple(values)
    return out if _only(out, float) else tuple(map(float, out))


def _only(values: tuple[Any, ...], kind: type) -> bool:
    """Whether every value's type is exactly ``kind`` (not a subclass: a bool is converted to its int)."""
    types = set(map(type, values))
    return not types or types == {kind}


@dataclass(frozen=True)
class EngineCall:
    """One generate call as the engine saw it: what it received and what it returned."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]  # stop token included when the engine stopped on one
    logprobs: tuple[float, ...] | None  # one per output id; None when the engine did not return them
    finish_reason: str = "stop"  # "stop" | "length" | anything else the engine reports

    @classmethod
    def of(
        cls,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        finish_reason: str = "stop",
    ) -> EngineCall:
        """From any sequences (lists, arrays): ids become ints, logprobs floats, the finish reason its string."""
        return cls(
            _as_ints(prompt_ids),
            _as_ints(output_ids),
            None if logprobs is None else _as_floats(logprobs),
            str(finish_reason),
        )

    @property
    def output_start(self) -> int:
        """The stream position of the first output id (the prompt's length)."""
        return len(self.prompt_ids)

    @property
    def output_end(self) -> int:
        """The stream position just after the last output id."""
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass(frozen=True)
class TrainerSample:
    """One rollout as the trainer receives it: prompt ids, then response ids with their mask and logprobs."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]
    response_logprobs: tuple[float, ...] | None = None

    @classmethod
    def of(
        cls,
        prompt_ids: Sequence[int],
        response_ids: Sequence[int],
        response_mask: Sequence[int],
        response_logprobs: Sequence[float] | None = None,
    ) -> TrainerSample:
        """From any sequences (lists, tensors' ``tolist()``): ids and mask become ints, logprobs floats."""
        return cls(
            _as_ints(prompt_ids),
            _as_ints(response_ids),
            _as_ints(response_mask),
            None if response_logprobs is None else _as_floats(response_logprobs),
        )

    @property
    def stream(self) -> tuple[int, ...]:
        """The training stream: prompt ids then response ids."""
        return self.prompt_ids + self.response_ids


def rollout_assistants(
    messages: Sequence[Mapping[str, Any]], n_calls: int, prompt_messages: int | None = None
) -> list[int]:
    """Indices of the assistant messages the rollout produced (message k answers engine call k).

    ``prompt_messages`` is how many messages the first prompt had (chat history or few-shot assistant messages
    in it are not engine output). Without it, when there are more assistant messages than calls, the last
    ``n_calls`` are taken.
    """
    start = prompt_messages or 0
    found = [i for i in range(start, len(messages)) if messages[i].get("role") == "assistant"]
    return found[-n_calls:] if prompt_messages is None and len(found) > n_calls else found


def engine_calls_from_trajectory(t: TokenTrajectory) -> list[EngineCall]:
    """The engine calls a token-core trajectory records, one per turn: the prompt the engine was sent, the ids and
    logprobs it returned, and the turn's finish reason ("stop" for a turn recorded without one)."""
    return [
        EngineCall.of(
            t.input_ids[: turn.prompt_length],
            t.input_ids[turn.sampled_start : turn.sampled_end],
            t.logprobs[turn.sampled_start : turn.sampled_end],
            turn.finish_reason.value if turn.finish_reason else "stop",
        )
        for turn in t.turns
    ]


def trainer_sample_from_trajectory(t: TokenTrajectory, response_length: int | None = None) -> TrainerSample:
    """The trainer's view of a token-core trajectory: the first prompt, then everything after it as the
    response, cut at ``response_length`` when given (as verl cuts it)."""
    if not t.turns:
        raise TrajectoryError("the trajectory has no engine call yet; a trainer sample needs at least one turn")
    p = t.turns[0].prompt_length
    end = len(t.input_ids) if response_length is None else min(len(t.input_ids), p + response_length)
    return TrainerSample.of(
        t.input_ids[:p],
        t.input_ids[p:end],
        t.loss_mask[p:end],
        t.logprobs[p:end] if t.has_logprobs else None,
    )
