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


class CauseKind(StrEnum):
    """Whether a cause is correct by design (verl_ext keeps the engine's tokens on purpose) or a defect."""

    ALLOWED = "allowed"
    DEFECT = "defect"


_NOTHING = "Nothing to do: "
SWITCH_LOOP = "Switch the loop to verl_ext (actor_rollout_ref.rollout.agent.default_agent_loop=verl_ext_tool_agent)"
_ALLOWED, _DEFECT = CauseKind.ALLOWED, CauseKind.DEFECT


class Cause(StrEnum):
    """Why the training stream differs from the template's rendering (or from pure engine output).

    Each member is the one record of its cause: its value (what records and metrics carry), its ``kind`` (allowed by
    design or a defect: ``ALLOWED_BY_DESIGN``), its one-line ``meaning``, its one-line ``fix`` (the report's "to do")
    and its ``color`` in the report's plots and tables (cool for allowed, warm for defects). Adding a cause is adding
    a member here (and its row in docs/check.md's cause table, which tests/test_docs_hygiene.py holds to these).
    """

    kind: CauseKind
    meaning: str
    fix: str
    color: str

    def __new__(cls, value: str, kind: CauseKind, color: str, meaning: str, fix: str) -> Cause:
        member = str.__new__(cls, value)
        member._value_ = value
        member.kind, member.color, member.meaning, member.fix = kind, color, meaning, fix
        return member

    BPE_REMERGE = (
        "bpe_remerge",
        _ALLOWED,
        "#1f77b4",
        "same text, different token split: re-encoding would change the ids",
        _NOTHING + "the stream keeps the ids the model sampled; re-encoding the text would change them.",
    )
    TOOL_CALL_RESERIALIZED = (
        "tool_call_reserialized",
        _ALLOWED,
        "#17becf",
        "the template re-serializes tool-call JSON",
        _NOTHING + "the tool-call JSON is trained as sampled; the template only re-serializes it.",
    )
    MALFORMED_TOOL_CALL = (
        "malformed_tool_call",
        _ALLOWED,
        "#9edae5",
        "a call the parser could not read: not in the message, kept as sampled",
        _NOTHING + "a tool call the parser could not read is trained as sampled; the loop answered it with an error "
        "(counted in tito/tool/malformed).",
    )
    REASONING_STRIPPED = (
        "reasoning_stripped",
        _ALLOWED,
        "#2ca02c",
        "the template drops earlier turns' thinking",
        _NOTHING + "the thinking is trained as sampled; the template drops it from later prompts.",
    )
    REASONING_INSERTED = (
        "reasoning_inserted",
        _ALLOWED,
        "#9467bd",
        "the template renders a (often empty) thinking block never sampled",
        _NOTHING + "the template renders a thinking block the model never sampled; it is not trained.",
    )
    EOS_ALIAS = (
        "eos_alias",
        _ALLOWED,
        "#7f7f7f",
        "the turn stopped on a stop id the template never renders (kept as sampled)",
        _NOTHING + "the turn stopped on an alias of end-of-text, kept as sampled; its close is added, mask 0.",
    )
    SYNTHETIC_CLOSE = (
        "synthetic_close",
        _ALLOWED,
        "#006d77",
        "a close the engine did not sample, inserted (mask 0)",
        _NOTHING + "the template's close was inserted with mask 0, so it is never trained.",
    )
    CLOSE_VARIANT = (
        "close_variant",
        _ALLOWED,
        "#5f9ea0",
        "the turn ended on another of the template's turn ends (kept as its close)",
        _NOTHING + "the turn ended on another of the template's turn ends, kept as its close.",
    )
    SPECIAL_TOKEN_ESCAPED = (
        "special_token_escaped",
        _ALLOWED,
        "#bcbd22",
        "special-token text in content kept as text",
        _NOTHING + "special-token text in tool/user content stays text, as the engine saw it.",
    )
    TOOL_RESULT_LABELLED = (
        "tool_result_labelled",
        _ALLOWED,
        "#98df8a",
        "a result names its own call where the template names another",
        _NOTHING + "each tool result is labelled with its own call's name, as the engine saw it.",
    )
    CONTEXT_MOVED = (
        "context_moved",
        _ALLOWED,
        "#c5b0d5",
        "the template renders prompt text (tool list, system) elsewhere once more follows",
        _NOTHING + "the template moves a block (tool list, system text); the stream keeps it in place.",
    )
    AMBIGUOUS_STOP_KEPT = (
        "ambiguous_stop_kept",
        _ALLOWED,
        "#aec7e8",
        "a stop that also opens the next message, kept once",
        _NOTHING + "a stop that also opens the next message is kept once.",
    )
    PREFILL_DROPPED = (
        "prefill_dropped",
        _ALLOWED,
        "#8da0cb",
        "the prompt's tail before a turn (a pre-fill, a close's whitespace) is not re-rendered as the engine saw it",
        _NOTHING + "the prompt's tail (an empty think block, a newline before a close) is kept as the engine saw it.",
    )
    CONTENT_WHITESPACE = (
        "content_whitespace",
        _ALLOWED,
        "#66c2a5",
        "whitespace the template strips or adds around sampled content",
        _NOTHING + "the content is trained as sampled; the template strips or adds whitespace.",
    )
    REASONING_REFORMATTED = (
        "reasoning_reformatted",
        _ALLOWED,
        "#6a3d9a",
        "sampled thinking the template re-writes (tags, order, parts)",
        _NOTHING + "the thinking is trained as sampled; the template re-writes its tags or parts.",
    )
    SAMPLED_TEXT_KEPT = (
        "sampled_text_kept",
        _ALLOWED,
        "#1b9e77",
        "the template writes the turn's message its own way; kept as sampled",
        _NOTHING + "the turn is trained as sampled; the template writes the same message its own way.",
    )
    TEMPLATE_REFUSED = (
        "template_refused",
        _ALLOWED,
        "#3b5b92",
        "the template refuses to render the final messages: no template view",
        "The template cannot render these messages (e.g. two tool calls in one turn): set "
        "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=1; the engine view still proves the tokens.",
    )
    BOUNDARY_MISSING = (
        "boundary_missing",
        _DEFECT,
        "#ff7f0e",
        'text the template renders after a close is absent ("\\n")',
        SWITCH_LOOP + ": the stock loop drops text the template renders after a turn's close (Qwen's \\n).",
    )
    CLOSE_MISSING = (
        "close_missing",
        _DEFECT,
        "#d62728",
        "a turn has no end-of-turn token where the template renders one",
        SWITCH_LOOP
        + " and list the engine's extra stops (e.g. </tool_call>) in verl_ext.extra_stop_tokens: a turn that "
        "stops on one then gets the template's close (`verl-ext check-template DIR --stop TOKEN` shows it).",
    )
    AMBIGUOUS_STOP_DUPLICATED = (
        "ambiguous_stop_duplicated",
        _DEFECT,
        "#8c564b",
        "the ambiguous stop appears twice",
        SWITCH_LOOP + ": it keeps a stop that also opens the next message once, not twice.",
    )
    SPECIAL_TOKEN_INJECTED = (
        "special_token_injected",
        _DEFECT,
        "#e377c2",
        "special-token text in content became a real token",
        SWITCH_LOOP
        + " with verl_ext.escape_special_tokens=true (default): tool text then stays text instead of becoming "
        "a fake turn boundary.",
    )
    STOP_TEXT_IN_MESSAGE = (
        "stop_text_in_message",
        _DEFECT,
        "#f4a261",
        "the loop decoded a stop token into an assistant message",
        SWITCH_LOOP + ": the stock hermes parser decodes the stop token into the assistant message.",
    )
    MESSAGE_DIFFERS = (
        "message_differs",
        _DEFECT,
        "#b8860b",
        "an assistant message does not hold what the engine sampled (a tool call)",
        "The loop's assistant message does not hold what the engine sampled (e.g. a tool call run with other "
        "arguments): build each message from the sampled ids with the tool parser, as verl_ext_tool_agent does "
        "(actor_rollout_ref.rollout.agent.default_agent_loop=verl_ext_tool_agent).",
    )
    CONTEXT_DIFFERS = (
        "context_differs",
        _DEFECT,
        "#b5541c",
        "a user, tool or system message is not what the engine saw (edited later)",
        "The loop's user, tool or system message (named in the detail) is not the text the engine saw: it was "
        "changed after the prompt was built. Keep the messages the loop appended as they were.",
    )
    # The version view (check/version_view.py): one turn's engine calls across aborts and weight updates.
    IDS_CUT_ON_ABORT = (
        "ids_cut_on_abort",
        _ALLOWED,
        "#5fa2ce",
        "ids an engine returned without logprobs were cut before a resume and regenerated (counted)",
        _NOTHING + "verl_ext's SGLang server keeps the ids its logprobs cover; the resume regenerates the rest.",
    )
    RESUME_RETOKENIZED = (
        "resume_retokenized",
        _DEFECT,
        "#c51b7d",
        "a resumed engine call was sent other ids than the turn's prompt + the ids sampled before the abort",
        "A resume re-tokenized the partial output (a text round trip): resume with the ids as sampled (verl_ext's "
        "loops resume through plugin/engine_turn.py), not through a client that decodes and re-encodes them.",
    )
    SEGMENT_DISCARDED = (
        "segment_discarded",
        _DEFECT,
        "#8c2d04",
        "a turn's output does not hold each engine call's ids where that call returned them (one dropped)",
        "A resume joined the attempts of a turn without one of them (verl's resume client rebuilds the output): "
        "join every attempt's ids in order (verl_ext's loops join them in plugin/engine_turn.py).",
    )
    SEGMENT_LOGPROBS_MISPLACED = (
        "segment_logprobs_misplaced",
        _DEFECT,
        "#e7298a",
        "a turn's logprobs over one engine call's ids are not the logprobs that call returned",
        "Keep each attempt's own logprobs with its ids when joining a resumed turn (none recomputed, none shifted).",
    )
    VERSION_STAMPED_ON_RETURN = (
        "version_stamped_on_return",
        _DEFECT,
        "#fb9a99",
        "an engine call's version is later than the weights that stopped it: stamped on return, not at dispatch",
        "Stamp weight_version_at_dispatch when the engine accepts the request (the CPU engine and verl_ext's SGLang "
        "server do); verl's server reads global_steps when the output returns, after the update that aborted it.",
    )
    VERSION_WENT_BACK = (
        "version_went_back",
        _DEFECT,
        "#a6761d",
        "a later engine call of the rollout was sent on an older policy version than an earlier one",
        "Versions only grow along a rollout: check the engine's weight_version_at_dispatch (a replica serving old "
        "weights after an update, or a version read from another replica).",
    )
    UNKNOWN = (
        "unknown",
        _DEFECT,
        "#7b0000",
        "a divergence no rule explains",
        "Open the rollout below and compare stream and template; `verl-ext replay FILE --tokenizer DIR` replays every "
        "record, numbered by line, and names where it differs from what was trained. Report it with the record if the "
        "template view is wrong.",
    )


# The causes that are correct by design: read from each cause's kind.
ALLOWED_BY_DESIGN: frozenset[Cause] = frozenset(c for c in Cause if c.kind is CauseKind.ALLOWED)


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
    # the image view (verl_ext.check.image_view): the trainer's images and their token spans are not the engine's
    IMAGE_DROPPED = "image_dropped"  # an image the engine was given is missing from the trainer's images or stream
    IMAGE_ORDER = "image_order"  # the trainer's images are the engine's, out of placeholder order
    IMAGE_EXPANSION = "image_expansion"  # a placeholder run's length is not what its image's grid implies
    IMAGE_TRAINED = "image_trained"  # an image's placeholder tokens carry loss mask 1
    IMAGE_SPAN = "image_span"  # a placeholder run not where the engine's prompt held it (or an image it never saw)
    # an engine call was given other images than its prompt's placeholder runs hold (one more or fewer, another
    # image, another order): its record of the images it was given against the trajectory's spans
    IMAGE_ENGINE_MISMATCH = "image_engine_mismatch"


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
    # Why the image view could not compare each engine call's images with its prompt's placeholder runs (the calls
    # hold no record of the images they were given: a loop or a record from before they were recorded); "" when it
    # could, or the rollout has no image evidence. Not a failure: the view says what it could not see.
    image_calls_unchecked: str = ""

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
        if self.image_calls_unchecked:
            parts.append(f"image view: {self.image_calls_unchecked}")
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
