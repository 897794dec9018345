"""What the template probe derives about one (tokenizer, template, template kwargs): ``TemplateProfile``, its
``Boundary`` per following role, its ``StopId``s, and its ``Verdict`` with the ``Reason``s (each of a ``Severity``).

These are the probe's result types only; ``core/probe.py`` renders the probe conversations that fill them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from verl_ext.core.errors import TemplateError
from verl_ext.core.tool_call_shape import ToolCallShape

END = "end"  # pseudo-role: the assistant turn is the last message of the conversation


class Verdict(StrEnum):
    OK = "ok"  # the template needs no repair: engine tokens and the template agree at every boundary
    REPAIRABLE = "repairable"  # verl_ext repairs what differs; the reasons list each repair
    UNSUPPORTED = "unsupported"  # a rollout cannot keep engine tokens with this template


class Severity(StrEnum):
    NOTE = "note"  # worth knowing; nothing to repair
    REPAIR = "repair"  # verl_ext restores or tolerates it by design
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class Reason:
    severity: Severity
    text: str


@dataclass(frozen=True)
class Boundary:
    """What the template renders where an assistant turn ends and a message of ``next_role`` starts.

    ``close_ids`` ends the assistant turn (the engine samples it when the turn ends normally);
    ``trailer_ids`` follow the close and are never generated (Qwen's "\\n"): they are restored as
    repair. ``delta_ids`` is the rest for the probe's own messages, ending with the generation prompt.
    """

    next_role: str
    close_ids: tuple[int, ...]
    trailer_ids: tuple[int, ...]
    delta_ids: tuple[int, ...]
    prefix_preserving: bool  # for every kind of turn the engine can produce (see ``not_preserving_with``)
    divergence: str = ""  # where the template re-renders the earlier turn, when not prefix-preserving
    # The kinds of assistant turn ("reasoning", "empty reasoning", "no reasoning") the template re-renders
    # differently once a message follows; empty when prefix-preserving.
    not_preserving_with: tuple[str, ...] = ()
    # The template writes no close after a single tool call, though it writes ``close_ids`` after several (an
    # upstream template bug): the engine's close is kept as sampled, and the delta starts right after the call.
    close_omitted: bool = False

    @property
    def boundary_id(self) -> int | None:
        """The first token after the assistant's body: its close, or the next message's opener."""
        if self.close_ids:
            return self.close_ids[0]
        return self.delta_ids[0] if self.delta_ids else None


@dataclass(frozen=True)
class StopId:
    id: int
    text: str
    # "template close", "template text" (the template writes it in some branch), "eos_token", "generation_config",
    # "end-of-text name", "user"
    sources: tuple[str, ...]


@dataclass(frozen=True)
class TemplateProfile:
    """Everything the probe derived about one (tokenizer, template, template kwargs)."""

    fingerprint: str
    tokenizer_name: str
    template_kwargs: Mapping[str, Any]
    boundaries: tuple[Boundary, ...]
    unsupported_roles: Mapping[str, str]  # append role -> why the template cannot append it
    stop_ids: tuple[StopId, ...]
    generation_prompt_ids: tuple[int, ...]
    strips_reasoning: bool | None  # None: the template never renders reasoning
    tool_call_arguments: str  # "verbatim" | "re-serialized" | "not rendered"
    consecutive_tool_results_grouped: bool | None
    verdict: Verdict
    reasons: tuple[Reason, ...]
    rendered_examples: Mapping[str, str] = field(default_factory=dict)
    # How an assistant turn with tool calls must look for this template (content "" or None, arguments as a
    # mapping or a JSON string); every render of a rollout and of the check puts messages into this shape.
    tool_call_shape: ToolCallShape = field(default_factory=ToolCallShape)
    # Whether an assistant turn may hold several tool calls (None: tool messages cannot be appended at all).
    parallel_tool_calls: bool | None = None
    parallel_tool_calls_error: str = ""  # what the template says when it refuses several calls in one turn
    # The template writes a tool round (the call turn's end, its results) differently once an earlier tool round is
    # in the conversation (namespace flags it never resets: DeepSeek R1 writes every result of a conversation into
    # one outputs block): deltas are rendered after a synthetic earlier round where the rollout had one.
    tool_rounds_share_state: bool = False
    # The tokenizer's own fingerprint (``ChatRenderer.tokenizer_fingerprint``): a report decoding the records with
    # another folder's tokenizer is refused by it, whatever chat template the run used.
    tokenizer_fingerprint: str = ""

    def boundary(self, next_role: str) -> Boundary:
        for b in self.boundaries:
            if b.next_role == next_role:
                return b
        why = self.unsupported_roles.get(next_role, "the probe did not derive it")
        raise TemplateError(
            f"cannot append a {next_role!r} message after an assistant turn with this template: {why}. "
            f"Appendable roles: {[b.next_role for b in self.boundaries if b.next_role != END]}"
        )

    @property
    def stop_id_set(self) -> frozenset[int]:
        return frozenset(s.id for s in self.stop_ids)

    @property
    def close_id_set(self) -> frozenset[int]:
        return frozenset(i for b in self.boundaries for i in b.close_ids)

    @property
    def turn_end_id_set(self) -> frozenset[int]:
        """Ids that end an assistant turn as the template writes it: its closes for each following role, and stop
        ids the template writes in another branch (Llama 3.x ``<|eom_id|>``, with builtin tools). A turn that stops
        on one is closed: it gets no synthetic close, even where the template writes another close there."""
        written = {s.id for s in self.stop_ids if "template text" in s.sources}
        return self.close_id_set | written

    @property
    def alias_stop_ids(self) -> tuple[StopId, ...]:
        """Stop ids the template never writes as a turn end (a turn ending on one gets a synthetic close)."""
        ends = self.turn_end_id_set
        return tuple(s for s in self.stop_ids if s.id not in ends)

    @property
    def alias_id_set(self) -> frozenset[int]:
        return frozenset(s.id for s in self.alias_stop_ids)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdict"] = self.verdict.value
        data["alias_stop_ids"] = sorted(self.alias_id_set)
        return data
