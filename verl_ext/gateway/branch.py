"""One branch of a session: a rollout, the messages the client sees, and a log to replay it from.

A branch is one rollout (``verl_ext.runtime.LiveRollout``, as every loop's): its stream is built by the token core
only (the first prompt rendered once, the engine's ids appended as sampled, every later message appended as a
delta), and it is checked and recorded on its own. The log keeps each operation with its engine call, so a fork
replays the parent's operations up to its last assistant turn inside the matched history and appends the request's
messages after it: the engine's ids are kept, and no history is re-rendered from text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.check.inputs import EngineCall, EngineCalls
from verl_ext.core.prompt_ids import PromptIds
from verl_ext.core.trajectory import TokenTrajectory
from verl_ext.core.version_spans import Attempt, RolloutVersions
from verl_ext.gateway.history import ROOT, Divergence, chain, message_key, tools_key
from verl_ext.runtime import LiveRollout


@dataclass(frozen=True)
class Fork:
    """Why a branch exists: its parent branch and where (which message, which field) the request departed."""

    parent: int
    divergence: Divergence
    replayed_turns: int  # the parent's assistant turns the branch kept (replayed as the engine sampled them)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, for records and responses."""
        return {"parent": self.parent, "replayed_turns": self.replayed_turns, **self.divergence.to_json()}


@dataclass(frozen=True)
class _Turn:
    """A logged assistant turn: the engine call and the messages (template's and client's) it produced."""

    call: EngineCall
    message: Mapping[str, Any] | None  # for the template: content as sampled, reasoning included
    visible: Mapping[str, Any]  # as the client got it
    end: int  # the number of client messages once this turn's message is added
    attempts: tuple[Attempt, ...] | None = None  # the engine's attempts at the call (None: the engine says none)
    label: Any = None  # the weight label the engine served the call on (None: it gave none)


class Branch:
    """One rollout of a session (module docstring). ``messages`` is the history as the client holds it."""

    def __init__(self, number: int, rollout: LiveRollout, fork: Fork | None = None) -> None:
        self.number = number
        self.rollout = rollout  # the trajectory, the engine calls, the replies and the clock: a rollout's
        self.fork = fork
        self.messages: list[Mapping[str, Any]] = []
        self.digests: list[bytes] = []  # digests[n]: the tools and the first n messages (set by start)
        self.turns: list[_Turn] = []
        self.exhausted = False  # the token budget is spent: every later call gets finish_reason "length"

    @property
    def trajectory(self) -> TokenTrajectory:
        assert self.rollout.trajectory is not None  # a gateway rollout always renders its own tokens
        return self.rollout.trajectory

    @property
    def calls(self) -> EngineCalls:
        return self.rollout.calls

    @property
    def first_messages(self) -> tuple[Mapping[str, Any], ...]:
        return self.rollout.first_messages

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        return self.rollout.tools

    @property
    def first_prompt(self) -> int:
        return self.rollout.first_prompt

    def start(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> PromptIds:
        """Render the first prompt (the only render of client text); returns it."""
        prompt = self.rollout.start(messages, tools)
        self.digests = [chain(ROOT, tools_key(tools))]
        self._add_messages(messages)
        return prompt

    def append(self, messages: Sequence[Mapping[str, Any]]) -> PromptIds:
        """Append tool, user or system messages after the last turn, through the token core (a reply)."""
        prompt = self.rollout.reply(messages)
        self._add_messages(messages)
        return prompt

    def add_turn(
        self,
        call: EngineCall,
        message: Mapping[str, Any] | None,
        visible: Mapping[str, Any],
        attempts: tuple[Attempt, ...] | None = None,
        label: Any = None,
    ) -> None:
        """Keep an engine call's output as sampled, with the message it parses to (and the client's view of it);
        ``message`` None for an output that is not a message (invalid engine output: the trajectory cuts it).
        ``attempts``: the engine calls it took (a turn resumed after a weight update takes two or more); ``label``:
        the weight label it was served on (``LiveRollout.keep``)."""
        self.rollout.keep(call, message, label=label)  # as every loop keeps a turn (verl_ext.runtime)
        self._add_messages([visible])
        self.turns.append(_Turn(call, message, visible, len(self.messages), attempts, label))

    def versions(self, trained_step: int | None) -> RolloutVersions | None:
        """The record's versions: every turn's attempts, in call order; None where a turn's engine says none."""
        if not self.turns or any(t.attempts is None for t in self.turns):
            return None
        return RolloutVersions(tuple(t.attempts or () for t in self.turns), trained_step=trained_step)

    @property
    def response_tokens(self) -> int:
        """Tokens after the first prompt: what the session's budget counts."""
        return self.rollout.response_tokens

    def _add_messages(self, messages: Sequence[Mapping[str, Any]]) -> None:
        for message in messages:
            self.messages.append(message)
            self.digests.append(chain(self.digests[-1], message_key(message)))

    def kept_end(self, upto: int) -> int:
        """The number of client messages up to and including this branch's last assistant turn within the first
        ``upto`` messages (0 when none): what a fork at ``upto`` keeps of it."""
        return max((t.end for t in self.turns if t.end <= upto), default=0)

    def replay_into(self, child: Branch, upto: int) -> int:
        """Replay this branch into ``child`` (a new branch), up to its last assistant turn within the first ``upto``
        messages; returns the number of client messages the child then holds (0 when no turn fits: the child is
        empty and must start from the request's messages)."""
        kept = [t for t in self.turns if t.end <= upto]
        if not kept:
            return 0
        child.start(self.first_messages, self.tools)
        previous = len(self.first_messages)
        for turn in kept:
            first = turn.end - 1  # the turn's own message
            if first > previous:
                child.append(self.messages[previous:first])
            child.add_turn(turn.call, turn.message, turn.visible, turn.attempts, turn.label)
            previous = turn.end
        return previous
