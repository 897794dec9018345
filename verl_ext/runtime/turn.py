"""One turn of a rollout: the budget it may sample, the engine call and its verdict, the reading of its output.

The runtime half of a turn (``RolloutRuntime.turn``) is the same for the agent loops and the gateway; what differs
(which engine, which reader, where the turn is kept) comes in as hooks (``verl_ext.runtime``'s docstring).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from verl_ext.check.inputs import EngineCall
from verl_ext.core.engine_output import OutputProblem
from verl_ext.core.trajectory import FinishReason, TokenTrajectory
from verl_ext.core.turn_parse import ParsedTurn


class Generated(Protocol):
    """What an engine hook returns: the ids as sampled (a stop id kept) and one logprob per id (or None). A hook that
    sends images also has ``images``: the images it passed the engine with the call, in the order passed (the
    engine call's record keeps their digests; absent or None: not recorded)."""

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def log_probs(self) -> Sequence[float] | None: ...


G = TypeVar("G", bound=Generated)


@dataclass(frozen=True)
class Turn(Generic[G]):
    """One generated turn: the engine call as recorded, how it ended (judged from the ids), the engine hook's own
    output (its extra fields), what is invalid in it, and its reading (None for an invalid output: no parser sees
    ids the trajectory cuts)."""

    call: EngineCall
    finish: FinishReason
    output: G
    problems: tuple[OutputProblem, ...]
    parsed: ParsedTurn | None

    @property
    def valid(self) -> bool:
        """No problem in the output: it may be parsed, kept whole and followed by another turn."""
        return not self.problems

    @property
    def message(self) -> dict[str, Any] | None:
        """The assistant message for the template; None for an invalid output."""
        return None if self.parsed is None else self.parsed.message

    def keep(self, trajectory: TokenTrajectory) -> None:
        """Append this turn to ``trajectory`` as sampled tokens (``keep_sampled``)."""
        keep_sampled(trajectory, self.call, self.message)


def keep_sampled(trajectory: TokenTrajectory, call: EngineCall, message: Mapping[str, Any] | None) -> None:
    """Keep an engine call's output as sampled, with the message it parses to; ``message`` None for an invalid
    output (the trajectory keeps it up to its first problem; nothing after it trains)."""
    trajectory.add_sampled(call.output_ids, call.logprobs, FinishReason(call.finish_reason), message=message)


def turn_budget(
    response_length: int,
    spent: int,
    *,
    requested: int | None = None,
    max_context: int | None = None,
    prompt_length: int = 0,
) -> int:
    """The tokens the next turn may sample: what is left of the response budget after ``spent`` tokens (everything
    after the first prompt), no more than a client ``requested`` and than the engine's context leaves after the
    prompt. At most 0: no turn (so nothing sampled is ever cut)."""
    left = response_length - spent
    if requested is not None:
        left = min(left, requested)
    if max_context is not None:
        left = min(left, max_context - prompt_length)
    return left
