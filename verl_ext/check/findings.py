"""The check's result as plain data: frozen dataclasses, JSON-serialisable through ``to_dict``.

Two kinds of result:
- ``EngineFailure``: the trainer's tokens are not the engine's. Always a bug, never allowed.
- ``Finding``: the training stream differs from the chat template's rendering of the final messages
  (or holds a token the engine never sampled where the model would have). Each has a ``Cause``; a
  cause is either allowed by design (verl_ext keeps the engine's tokens on purpose) or a defect.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Cause(StrEnum):
    """Why the training stream differs from the template's rendering (or from pure engine output)."""

    BPE_REMERGE = "bpe_remerge"  # same text, different token split: re-encoding would change the ids
    TOOL_CALL_RESERIALIZED = "tool_call_reserialized"  # the template re-serializes tool-call JSON
    MALFORMED_TOOL_CALL = "malformed_tool_call"  # a call the parser could not read: not in the message, kept as sampled
    REASONING_STRIPPED = "reasoning_stripped"  # the template drops earlier turns' thinking
    REASONING_INSERTED = "reasoning_inserted"  # the template renders a (often empty) thinking block never sampled
    EOS_ALIAS = "eos_alias"  # the turn stopped on a stop id the template never renders (kept as sampled)
    SYNTHETIC_CLOSE = "synthetic_close"  # a close the engine did not sample, inserted (mask 0)
    CLOSE_VARIANT = "close_variant"  # the turn ended on another of the template's turn ends (kept as its close)
    SPECIAL_TOKEN_ESCAPED = "special_token_escaped"  # special-token text in content kept as text
    TOOL_RESULT_LABELLED = "tool_result_labelled"  # a result names its own call where the template names another
    CONTEXT_MOVED = "context_moved"  # the template renders prompt text (tool list, system) elsewhere once more follows
    AMBIGUOUS_STOP_KEPT = "ambiguous_stop_kept"  # a stop that also opens the next message, kept once
    PREFILL_DROPPED = "prefill_dropped"  # the generation prompt's pre-fill (empty think block) is not re-rendered
    CONTENT_WHITESPACE = "content_whitespace"  # whitespace the template strips or adds around sampled content
    REASONING_REFORMATTED = "reasoning_reformatted"  # sampled thinking the template re-writes (tags, order, parts)
    SAMPLED_TEXT_KEPT = "sampled_text_kept"  # the template writes the turn's message its own way; kept as sampled
    TEMPLATE_REFUSED = "template_refused"  # the template refuses to render the final messages: no template view
    BOUNDARY_MISSING = "boundary_missing"  # text the template renders after a close is absent ("\n")
    CLOSE_MISSING = "close_missing"  # a turn has no end-of-turn token where the template renders one
    AMBIGUOUS_STOP_DUPLICATED = "ambiguous_stop_duplicated"  # the ambiguous stop appears twice
    SPECIAL_TOKEN_INJECTED = "special_token_injected"  # special-token text in content became a real token
    STOP_TEXT_IN_MESSAGE = "stop_text_in_message"  # the loop decoded a stop token into an assistant message
    MESSAGE_DIFFERS = "message_differs"  # an assistant message does not hold what the engine sampled (a tool call)
    UNKNOWN = "unknown"  # a divergence no rule explains


ALLOWED_BY_DESIGN: frozenset[Cause] = frozenset(
    {
        Cause.BPE_REMERGE,
        Cause.TOOL_CALL_RESERIALIZED,
        Cause.MALFORMED_TOOL_CALL,
        Cause.REASONING_STRIPPED,
        Cause.REASONING_INSERTED,
        Cause.EOS_ALIAS,
        Cause.SYNTHETIC_CLOSE,
        Cause.CLOSE_VARIANT,
        Cause.SPECIAL_TOKEN_ESCAPED,
        Cause.TOOL_RESULT_LABELLED,
        Cause.CONTEXT_MOVED,
        Cause.AMBIGUOUS_STOP_KEPT,
        Cause.PREFILL_DROPPED,
        Cause.CONTENT_WHITESPACE,
        Cause.REASONING_REFORMATTED,
        Cause.SAMPLED_TEXT_KEPT,
        Cause.TEMPLATE_REFUSED,
    }
)


class FailureKind(StrEnum):
    """The kind of an engine-view failure; every one is a bug, never allowed."""

    LENGTH = "length"  # response ids, mask and logprobs differ in length
    PREFIX = "prefix"  # a prompt the engine received is not a prefix of the training stream
    STREAM = "stream"  # the stream is not the engine's final prompt + final output
    MASK = "mask"  # loss mask is not 1 exactly on engine-sampled tokens
    LOGPROB = "logprob"  # a logprob differs from the engine's
    RECORD = "record"  # the engine record itself is inconsistent (e.g. no engine call recorded)
    # invalid engine output (verl_ext.core.engine_output): never a training token
    NEGATIVE_ID = "negative_id"  # a negative output id
    ID_OUT_OF_VOCAB = "id_out_of_vocab"  # an output id the tokenizer cannot decode
    LOGPROB_COUNT = "logprob_count"  # not one logprob per output id
    LOGPROB_NOT_FINITE = "logprob_not_finite"  # a NaN or infinite logprob
    LOGPROB_POSITIVE = "logprob_positive"  # a logprob above 0
    NAN_STOP = "nan_stop"  # a stop id the engine substituted for a NaN sample (SGLang's "NaN happened")


# The failures that are the engine's output itself being invalid (rather than the rollout changing it).
ENGINE_OUTPUT_FAILURES: frozenset[FailureKind] = frozenset(
    {
        FailureKind.NEGATIVE_ID,
        FailureKind.ID_OUT_OF_VOCAB,
        FailureKind.LOGPROB_COUNT,
        FailureKind.LOGPROB_NOT_FINITE,
        FailureKind.LOGPROB_POSITIVE,
        FailureKind.NAN_STOP,
    }
)


@dataclass(frozen=True)
class EngineFailure:
    """One engine-view failure: its kind, the engine call and stream position it starts at (None: the whole
    sample), and a one-line detail."""

    kind: FailureKind
    turn: int | None
    position: int | None  # stream index (prompt + response) of the first offending token
    detail: str


@dataclass(frozen=True)
class Span:
    """Token positions ``start`` to ``end`` (exclusive); empty where one side has nothing."""

    start: int
    end: int  # exclusive

    def __len__(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Finding:
    """One divergence, located on both sides and explained."""

    cause: Cause
    allowed: bool
    turn: int  # engine call (assistant turn) index the divergence belongs to
    boundary: str  # "assistant→tool": at a turn's end or in the context after it; "" inside a sampled turn
    region: str  # "prompt" | "sampled" | "boundary" | "context": where it is in the stream
    stream: Span  # token positions in the training stream
    rendered: Span  # token positions in the template's rendering ("" span when not compared)
    stream_ids: tuple[int, ...]
    rendered_ids: tuple[int, ...]
    stream_text: str
    rendered_text: str
    context_before: str  # a few decoded tokens before, on the stream side
    context_after: str
    detail: str = ""


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one rollout."""

    engine_failures: tuple[EngineFailure, ...]
    findings: tuple[Finding, ...]
    template_view: bool  # whether the template view ran on this rollout
    truncated: bool  # the trainer's response was cut at its response length
    lost_sampled_tokens: int  # engine-sampled tokens beyond the cut
    num_turns: int
    num_sampled: int
    repairs: Counter[str] = field(default_factory=Counter)  # edit-log kind -> count, when known
    seconds: float = 0.0
    # Why the template view stopped before its end (its time budget ran out); "" when it ran or was not drawn.
    # A skipped rollout keeps its engine view and turn-end findings; ``check_skipped`` in tito/ counts them.
    template_view_skipped: str = ""

    @property
    def engine_ok(self) -> bool:
        """The engine view found nothing: the trainer trains on the engine's tokens."""
        return not self.engine_failures

    @property
    def defects(self) -> tuple[Finding, ...]:
        """The findings whose cause the policy does not allow."""
        return tuple(f for f in self.findings if not f.allowed)

    @property
    def ok(self) -> bool:
        """Engine view passed and no finding is a defect."""
        return self.engine_ok and not self.defects

    def cause_counts(self) -> Counter[str]:
        """Findings per cause value."""
        return Counter(f.cause.value for f in self.findings)

    def summary(self) -> str:
        """One line: ok / the failure or defect count, turns, sampled tokens, causes, truncation, a skip."""
        if self.ok:
            head = "ok"
        elif not self.engine_ok:
            head = f"ENGINE VIEW FAILED ({len(self.engine_failures)} failures)"
        else:
            head = f"{len(self.defects)} defect(s)"
        parts = [head, f"{self.num_turns} turns", f"{self.num_sampled} sampled tokens"]
        if self.findings:
            parts.append(", ".join(f"{c}×{n}" for c, n in sorted(self.cause_counts().items())))
        if self.truncated:
            parts.append(f"truncated ({self.lost_sampled_tokens} sampled tokens lost)")
        if self.template_view_skipped:
            parts.append(f"template view skipped: {self.template_view_skipped}")
        return "; ".join(parts)

    def verdict_fields(self) -> dict[str, Any]:
        """The compact verdict a trainer batch carries per sample (verl ``extra_fields``)."""
        return {
            "ok": self.ok,
            "engine_ok": self.engine_ok,
            "summary": self.summary(),
            "causes": dict(self.cause_counts()),
            "truncated": self.truncated,
            "lost_sampled_tokens": self.lost_sampled_tokens,
            "template_view_skipped": self.template_view_skipped,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the ``check`` object a record line holds for this result (``RecordedCheck.of(self).to_json()``,
        the one serialiser: the two cannot differ), causes and failure kinds as strings, ``seconds`` to the µs."""
        from verl_ext.check.record import RecordedCheck  # record.py imports this module

        return RecordedCheck.of(self).to_json()
