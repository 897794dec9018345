"""Cause rules: one function per cause, each naming the cause of one divergence or passing; ``RULES`` runs them in
order and the first that names a cause wins. Rules look at tokens and the template profile only (never at a model
name)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl_ext.check.call_spacing import differing_whitespace, whitespace_only
from verl_ext.check.findings import Cause

if TYPE_CHECKING:
    from verl_ext.check.rule_context import RuleContext


# -- the cause rules ------------------------------------------------------------------------------------------
# Each rule looks at one divergence and names its cause with a detail, or returns None when it does not apply.
# ``RULES`` runs them in order and the first match wins; the comments there say where the order matters.

Named = tuple[Cause, str] | None


@dataclass(frozen=True)
class Divergence:
    """One divergent span of the alignment, ``stream[i1:i2]`` against ``rendered[j1:j2]``, as the rules read it.

    ``region`` is the stream region at ``i1`` (prompt, sampled, boundary, context); ``at_end`` holds when the span
    touches a turn's end (or lies in the few tokens after it); ``at_boundary`` when it lies between a turn and the
    next (or is an empty stream span at a turn's end). ``ctx`` is what every rule can read besides the span."""

    ctx: RuleContext
    i1: int
    i2: int
    j1: int
    j2: int
    s_ids: tuple[int, ...]
    r_ids: tuple[int, ...]
    ds: str  # the stream span's text
    dr: str  # the rendered span's text
    region: str
    at_end: bool
    at_boundary: bool

    @property
    def spans(self) -> tuple[int, int, int, int]:
        """``(i1, i2, j1, j2)``, as ``classify`` takes them."""
        return self.i1, self.i2, self.j1, self.j2

    @classmethod
    def of(
        cls, ctx: RuleContext, i1: int, i2: int, j1: int, j2: int, texts: tuple[str, str] | None = None
    ) -> Divergence:
        """The divergence ``stream[i1:i2]`` vs ``rendered[j1:j2]`` with its texts and where it lies. ``texts``: the
        two spans' texts, when the caller has decoded them already."""
        s_ids, r_ids = tuple(ctx.stream[i1:i2]), tuple(ctx.rendered[j1:j2])
        ds, dr = (ctx.r.decode(s_ids), ctx.r.decode(r_ids)) if texts is None else texts
        region = ctx.loc.region(min(i1, max(len(ctx.stream) - 1, 0)))
        return cls(
            ctx,
            i1,
            i2,
            j1,
            j2,
            s_ids,
            r_ids,
            ds,
            dr,
            region,
            at_end=ctx._touches_turn_end(i1, i2) or region == "boundary",
            at_boundary=region in ("boundary", "context") or (i1 == i2 and ctx._at_turn_end(i1)),
        )


def special_token_injected(d: Divergence) -> Named:
    """Same text; the stream has special tokens where the render writes their text: message content's special-token
    text became a real special token (a fake turn boundary). Never in a sampled span: there the render writes what
    the engine sampled."""
    special = d.ctx.r.control_ids
    if d.region != "sampled" and d.ds == d.dr and set(d.s_ids) & special and not set(d.r_ids) & special:
        return (
            Cause.SPECIAL_TOKEN_INJECTED,
            "special-token text in tool/user/system content became a real special token",
        )
    return None


def special_token_escaped(d: Divergence) -> Named:
    """Same text; the render has special tokens where the stream has their text: content that holds special-token
    text was kept as text, as the engine saw it (the safe way)."""
    special = d.ctx.r.control_ids
    # Only the engine's own text: special-token text in untrusted content is compared with the escaped render (no
    # divergence there), so outside sampled tokens this is structure written as text (a broken turn boundary).
    if d.ds == d.dr and set(d.r_ids) & special and not set(d.s_ids) & special and d.ctx._all_sampled(d.i1, d.i2):
        return Cause.SPECIAL_TOKEN_ESCAPED, "special-token text the engine sampled as text, kept as it sampled it"
    return None


def bpe_remerge(d: Divergence) -> Named:
    """Same text (or the same once the tokenizer's normalizer has run) in other ids: the sampled split is not the
    one re-encoding the text gives. Never a different set of control tokens: a split of text does not make or undo
    a special token (the special-token rules before this one name those that are allowed)."""
    control = d.ctx.r.control_ids
    if {i for i in d.s_ids if i in control} != {i for i in d.r_ids if i in control}:
        return None
    if d.ds == d.dr:
        if d.ctx._same_after_last_match(d):
            return Cause.BPE_REMERGE, f"same text, {len(d.s_ids)} ids in the stream vs {len(d.r_ids)} when re-encoded"
    elif d.ctx._same_normalized(d.ds, d.dr) and d.ctx._same_after_last_match(d):
        return Cause.BPE_REMERGE, "re-encoding normalizes the sampled text (the tokenizer's normalizer)"
    return None


def close_variant(d: Divergence) -> Named:
    """At a turn end, one turn-end token in the stream against one close in the render: the turn stopped on another
    of the template's turn ends (GPT-OSS ``<|return|>``, Llama ``<|eom_id|>``) and keeps it as its close."""
    c = d.ctx
    one = len(d.s_ids) == 1 and d.s_ids[0] in c.turn_ends and len(d.r_ids) == 1 and d.r_ids[0] in c.closes
    if d.at_end and one and c._all_sampled(d.i1, d.i2):  # the engine's stop: a close verl_ext wrote is the template's
        return (
            Cause.CLOSE_VARIANT,
            f"the turn ended on {d.ds!r}, one of the template's turn ends; it writes {d.dr!r} here",
        )
    return None


def close_missing(d: Divergence) -> Named:
    """At a turn end, the render has a close the stream lacks: the turn stopped on an alias (and got no close),
    or on nothing the template closes with."""
    c = d.ctx
    if d.at_end and d.s_ids and d.s_ids[-1] in c.aliases and set(d.r_ids) & c.closes and not c._closed_after(d):
        return Cause.CLOSE_MISSING, f"the turn stopped on {c.r.decode(d.s_ids[-1:])!r} and has no close"
    # A turn that ended on another of the template's turn ends is closed (its turn-end finding names the variant).
    if d.at_end and set(d.r_ids) & c.closes and not set(d.s_ids) & c.turn_ends and not c._closed_after(d):
        has = f"has {d.ds!r}" if d.ds else "has nothing there"
        return Cause.CLOSE_MISSING, f"the template closes the turn with {d.dr!r}; the stream {has}"
    return None


def eos_alias(d: Divergence) -> Named:
    """Stream-only stop ids the template never renders (e.g. ``<|endoftext|>``): the sampled stop, kept."""
    aliases = d.ctx.aliases  # all(): a stripped block's first id answers, no set of its thousands of ids
    if d.s_ids and not d.r_ids and all(i in aliases for i in d.s_ids) and d.ctx._all_sampled(d.i1, d.i2):
        return Cause.EOS_ALIAS, f"the stream keeps the sampled stop {d.ds!r}, which the template never renders"
    return None


def ambiguous_stop_duplicated(d: Divergence) -> Named:
    """One stream-only stop id right after the same id: the loop appended the next message's opener after a
    sampled stop that already was that opener (GLM's ``<|observation|>``)."""
    c = d.ctx
    if d.i1 > 0 and len(d.s_ids) == 1 and not d.r_ids and d.s_ids[0] in c.stops and c.stream[d.i1 - 1] == d.s_ids[0]:
        return Cause.AMBIGUOUS_STOP_DUPLICATED, f"{d.ds!r} appears twice: sampled, then again as the next opener"
    return None


def context_moved(d: Divergence) -> Named:
    """A one-sided block of the prompt or the context that the other side holds elsewhere (Mistral's tool list,
    written before the last user message): moved, not lost or added."""
    moved = d.ctx._moved(d.ds, d.dr, d.region)
    if moved:
        return Cause.CONTEXT_MOVED, (
            f"the template renders {moved!r} at another place of the final conversation (a tool list written "
            "before the last user message); the stream keeps it where the engine saw it"
        )
    return None


def tool_result_labelled(d: Divergence) -> Named:
    """In the context, two names of tool calls of one turn swapped: the stream labels each result with its own
    call's name; the template labels every result after one call (GPT-OSS)."""
    if d.region == "context" and d.ctx._call_names_swapped(d.ds, d.dr):
        return Cause.TOOL_RESULT_LABELLED, (
            f"the tool result is labelled with its own call's name {d.ds.strip(NAME_EDGE)!r}; the template labels "
            f"it {d.dr.strip(NAME_EDGE)!r}, another call of the same turn (it names every result after one call)"
        )
    return None


def turn_start_whitespace(d: Divergence) -> Named:
    """At a turn's start, whitespace the template writes before the message's content and its generation prompt does
    not (Mistral v0.3 writes " " + content after "[/INST]", where its prompts end): the engine saw the prompt without
    it and the stream keeps the turn as sampled, or, for an empty output, verl_ext's close right after the prompt.
    Read after the prompt's last token (a SentencePiece span decoded alone loses its leading space). Only where the
    stream holds the template's whole generation prompt before the turn: one the loop cut short (Qwen's
    "assistant\n" without its newline) leaves render-only whitespace here too, and that is a defect."""
    c = d.ctx
    if d.ds.strip() != d.dr.strip():
        return None  # decoded alone a span loses at most its leading space: read after the prompt, not whitespace only
    if not d.i1 or not d.j1 or not c._at_turn_start(d.i1):
        return None
    if c.stream[d.i1 - 1] != c.rendered[d.j1 - 1] or not c.prompt_intact(d.i1):
        return None
    before = c.stream[d.i1 - 1]
    head = c.r.decode([before])
    ours, theirs = c.r.decode([before, *d.s_ids]), c.r.decode([before, *d.r_ids])
    if not (ours.startswith(head) and theirs.startswith(head)):
        return None
    ours, theirs = ours[len(head) :], theirs[len(head) :]
    added = theirs[: len(theirs) - len(ours)]
    if len(theirs) > len(ours) and theirs.endswith(ours) and added.isspace():
        return Cause.CONTENT_WHITESPACE, (
            f"the template writes {added!r} before the turn's content after the prompt the engine saw, which ends "
            f"in {head!r}; the stream keeps the turn as the engine saw and sampled it"
        )
    return None


def prompt_tail_whitespace(d: Divergence) -> Named:
    """Whitespace only (the two texts equal once it is set aside), in the tail of the prompt before a turn's output
    that the template writes otherwise once the turn is history (``_prefills``), where the stream holds that tail as
    the template wrote it for the engine: the text a template writes before a close, compared as the spacing it is.
    Hermes' tool_use templates write a tool result's newline before its close only once another message follows, so
    every prompt the engine saw ends ``</tool_response><|im_end|>`` and the final render has ``</tool_response>\n``
    there (``>`` against ``>\n`` where the tokenizer merges the newline into the tag's last token)."""
    c = d.ctx
    if not whitespace_only(d.ds, d.dr) or d.region == "sampled":
        return None
    turn = c.loc.turn(d.i1) + 1 if d.region != "prompt" else 0
    if turn >= len(c.loc.calls) or d.i2 > (start := c.loc.calls[turn].output_start) or not c._in_prefill(d, start):
        return None
    wrote, saw = differing_whitespace(d.dr, d.ds)
    return Cause.PREFILL_DROPPED, (
        f"whitespace only, in the prompt's tail before turn {turn}: the template writes {wrote!r} where the prompt "
        f"the engine saw has {saw!r} once the turn is history (before a close it writes only once more follows); "
        "the stream keeps the prompt as the engine saw it"
    )


def boundary_missing(d: Divergence) -> Named:
    """Between turns, whitespace the template renders and the stream lacks (a newline after a close not restored)."""
    if d.at_boundary and not d.s_ids and not d.dr.strip():
        return Cause.BOUNDARY_MISSING, f"the template renders {d.dr!r} here; the stream does not have it"
    return None


def prefill_dropped(d: Divergence) -> Named:
    """Stream-only text the generation prompt pre-filled before a turn (an empty think block with thinking off),
    which the template does not re-render once the turn is history."""
    if not d.r_ids and d.ctx._prefill_dropped(d.i1, d.i2) == "prefill":
        return Cause.PREFILL_DROPPED, (
            f"the prompt the engine saw ends in {d.ds!r} before this turn; the template does not write it once the "
            "turn is history (e.g. an empty think block with thinking disabled); kept as the engine saw it"
        )
    return None


def reasoning_stripped_with_prefill(d: Divergence) -> Named:
    """Stream-only text from the pre-filled thinking opener into the sampled reasoning, on a template that strips
    earlier turns' reasoning."""
    c = d.ctx
    if (
        not d.r_ids
        and c.profile.strips_reasoning
        and c._prefill_dropped(d.i1, d.i2) == "prefill and sampled"
        and c.within_reasoning(d.i1, d.i2)
    ):
        return Cause.REASONING_STRIPPED, (
            f"the template drops this turn's thinking {d.ds!r}: the opener the generation prompt pre-filled and the "
            "sampled reasoning after it; kept as the engine saw it"
        )
    return None


def reasoning_inserted(d: Divergence) -> Named:
    """Render-only text (no stop in it) at the start of a turn, on a template with a reasoning convention: the
    template writes an (empty) think block the model never sampled. Only after the template's whole generation
    prompt: a prompt the loop cut short (Qwen's "assistant" without its newline) leaves render-only text here too,
    in tokens verl_ext wrote, and that is a defect."""
    c = d.ctx
    no_stop = not set(d.r_ids) & c.stops
    if not c.prompt_intact(d.i1):
        return None
    if not d.s_ids and no_stop and c.profile.strips_reasoning is not None and c._at_turn_start(d.i1):
        return Cause.REASONING_INSERTED, f"the template renders {d.dr!r} before the sampled text; never sampled"
    return None


def tool_call_reserialized(d: Divergence) -> Named:
    """Inside a sampled tool call's JSON whose objects parse equal on both sides: the same call, serialized
    differently (key order, spacing)."""
    if d.region != "sampled":
        return None
    turn = d.ctx.loc.turn(d.i1)
    if d.ctx._inside_json(turn, d.i1) and d.ctx._tool_calls_equal(turn):
        return Cause.TOOL_CALL_RESERIALIZED, "tool-call JSON is the same object, serialized differently"
    return None


def reasoning_stripped(d: Divergence) -> Named:
    """Sampled text the render shortens to a part of itself, on a template that strips earlier turns' reasoning, where
    the text it drops lies in the turn's reasoning (``within_reasoning``): a dropped call after it is not reasoning."""
    if d.region != "sampled" or not d.ctx.profile.strips_reasoning or not d.ctx.within_reasoning(d.i1, d.i2):
        return None
    # A render that keeps no text of the block (the usual strip) is in it trivially: no need to squash the block.
    kept = squash(d.dr)
    if len(d.ds) > len(d.dr) and (not kept or kept in squash(d.ds)):
        return Cause.REASONING_STRIPPED, f"the template drops {len(d.ds) - len(d.dr)} characters of this turn"
    return None


def turn_without_message(d: Divergence) -> Named:
    """Sampled text with nothing rendered, where the final messages hold fewer assistant messages than engine
    calls: the loop dropped a turn from its messages. Still ``UNKNOWN`` (a defect), with the reason."""
    c = d.ctx
    if d.region == "sampled" and len(c.assistants) < len(c.loc.calls) and not d.r_ids:
        return Cause.UNKNOWN, (
            f"the final messages hold {len(c.assistants)} assistant messages for {len(c.loc.calls)} engine "
            f"calls: sampled text {d.ds[:80]!r} has no message (the loop dropped a turn from its messages)"
        )
    return None


def stop_text_in_message(d: Divergence) -> Named:
    """Render-only stop-token text that an assistant message's content holds: the loop decoded the sampled stop
    token into the message, and the template renders it again."""
    c = d.ctx
    leaked = sorted({c.r.decode([i]) for i in d.r_ids if i in c.stops} & c._assistant_texts())
    if not d.s_ids and leaked:
        return Cause.STOP_TEXT_IN_MESSAGE, (
            f"the template renders {d.dr!r} that the stream lacks: an assistant message's content holds the stop "
            f"token text {leaked[0]!r} (the loop decoded the stop token into the message)"
        )
    return None


# First match wins. The order is the one the rules were written in; where two rules can match one divergence, the
# comment on the later rule names the earlier one that takes it and why that reading is the right one. A rule
# without a comment has no known overlap with an earlier one.
RULES: tuple[Callable[[Divergence], Named], ...] = (
    special_token_injected,
    special_token_escaped,
    # after special_token_escaped: escaped special-token text is also "the same text in other ids", but the
    # escape is the more specific fact. Every rule after this one sees two different texts.
    bpe_remerge,
    # after bpe_remerge: "the same text in other ids" once read after the prompt's last token; what differs there by
    # leading whitespace at a turn's start is the template's own seam
    turn_start_whitespace,
    close_variant,
    # after close_variant: a turn that stopped on a template-written turn end that is not a close (Llama's
    # <|eom_id|>) has "a close the stream lacks" too, but it is closed: the variant is the fact
    close_missing,
    eos_alias,
    # after eos_alias: a repeated stop that is also an alias the template never renders is the kept sampled stop
    ambiguous_stop_duplicated,
    context_moved,
    tool_result_labelled,
    # before boundary_missing: render-only whitespace between turns is the template's where it lies in the prompt's
    # tail before a turn, which the stream holds as the template wrote it for the engine (a stock loop that dropped a
    # newline after a close holds no such tail: boundary_missing names it)
    prompt_tail_whitespace,
    # after close_missing: on a template whose close is whitespace text, a missing close is named as such
    boundary_missing,
    prefill_dropped,
    reasoning_stripped_with_prefill,
    reasoning_inserted,
    tool_call_reserialized,
    # after tool_call_reserialized: a tool call's JSON re-serialized shorter (no spaces) is also "sampled text the
    # render shortens to a part of itself"; the parsed objects being equal is the more specific fact
    reasoning_stripped,
    # after reasoning_stripped and eos_alias: a stream-only sampled span is read as stripped reasoning (on templates
    # that strip it) or a kept stop before the loop is blamed for a lost message
    turn_without_message,
    # after close_missing: a render-only close at a turn end is a missing close, even when a message holds its text
    stop_text_in_message,
)


NAME_EDGE = " .:=\"'"  # what a template writes around a tool name ("functions.NAME to=")


def squash(text: str) -> str:
    return "".join(text.split())
