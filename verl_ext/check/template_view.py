"""Template view: render the final messages with the chat template, align, and explain each divergence.

The training stream is the engine's tokens; the re-render is what ``apply_chat_template`` would give for
the same conversation. Where they differ, a rule names the cause (``cause_rules``: one function per cause, first
match wins, over what ``rule_context`` holds); a divergence inside a sampled turn is judged by the turn's verdict
(``sampled_turn``). What no rule explains is ``UNKNOWN``. This module drives it: render, align, explain each span.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from verl_ext.check.align import align, check_deadline
from verl_ext.check.cause_rules import Divergence
from verl_ext.check.findings import Cause, Finding, Span
from verl_ext.check.locate import Locator
from verl_ext.check.rule_context import RuleContext
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_profile import TemplateProfile

Span5 = tuple[int, int, int, int, int]  # a divergence: stream [i1, i2), render [j1, j2), and its segment


def template_findings(
    loc: Locator,
    profile: TemplateProfile,
    renderer: ChatRenderer,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    explained: set[int],
    allowed: Callable[[Cause], bool],
    deadline: float | None = None,
) -> list[Finding]:
    """Findings for every divergence between ``loc.stream`` and the template's rendering of ``messages``.

    ``explained`` holds stream positions already covered by turn-end findings; a divergence made only of
    those positions is not reported twice. Past ``deadline`` (a ``time.perf_counter()`` value) it raises
    ``BudgetExceeded`` saying how far it got, rather than run on.
    """
    stream = loc.stream
    # The tool-call convention the trajectory rendered with (content None or "", arguments object or string).
    shaped = profile.tool_call_shape.conform(messages)
    native = renderer.render(shaped, tools, add_generation_prompt=False, escape=False).ids
    check_deadline(deadline, f"after rendering the conversation ({len(native)} tokens)")
    escaping = bool(renderer.escapes(messages))
    if escaping:
        # Untrusted content holds special-token text. verl_ext keeps it as text, so the stream is compared with the
        # escaped render (the template's text, special-token text encoded as text); where the native render makes
        # special tokens of it is listed apart, as allowed findings.
        native_ids, native = native, renderer.render(shaped, tools, add_generation_prompt=False, escape=True).ids
        check_deadline(deadline, "after rendering the conversation with special-token text escaped")
    rules = RuleContext(loc, profile, renderer, messages, stream, native, deadline, tools)
    out: list[Finding] = []
    spans = _one_per_call(rules, _divergent_spans(rules, explained))
    # Every span's two texts in one batch, decoded once (rules and findings read them): a stripped thinking block is
    # thousands of tokens, and the batch decodes the blocks on the free cores.
    decoded = rules.texts([span for i1, i2, j1, j2, _ in spans for span in ((True, i1, i2), (False, j1, j2))])
    turns = [rules.parts[seg] for seg in dict.fromkeys(seg for *_, seg in spans) if rules.parts[seg].sampled]
    # then the texts of the turns those spans lie in, which their verdicts read: each the rest of what is decoded
    rules.texts([span for p in turns for span in rules.turn_spans(p)])
    per_turn: dict[int, list[int]] = {}  # the findings of each sampled segment, by index in ``out``
    for k, (i1, i2, j1, j2, seg) in enumerate(spans):
        check_deadline(deadline, f"explaining divergence {k + 1} of {len(spans)}")
        d = Divergence.of(rules, i1, i2, j1, j2, texts=(decoded[2 * k], decoded[2 * k + 1]))
        cause, detail = rules.explain(d)
        part = rules.parts[seg]
        if part.sampled and rules.inside_turn(d, part):
            cause, detail = rules.sampled_cause(d, part, cause, detail)
            per_turn.setdefault(seg, []).append(len(out))
        texts = (d.ds, d.dr)
        # Tokens the stream lacks at a gap's end are context missing after the turn before the gap, not the next
        # turn's: located by the gap's last token (the position itself is where the next output starts).
        at = i1 - 1 if not part.sampled and i1 == i2 == part.i2 > part.i1 and seg > 0 else i1
        where = {"turn": loc.turn(at), "region": loc.region(at)} if at != i1 else {}
        out.append(
            loc.finding(cause, allowed(cause), Span(i1, i2), Span(j1, j2), d.r_ids, detail, texts=texts, **where)
        )
    for seg, indices in per_turn.items():
        verdict = rules.verdict(rules.parts[seg])
        if not verdict.holds and all(out[i].cause is not Cause.MESSAGE_DIFFERS for i in indices):
            # Every divergence of the turn has an innocent reading, but the message does not hold what was sampled.
            first = out[indices[0]]
            out[indices[0]] = dataclasses.replace(
                first, cause=Cause.MESSAGE_DIFFERS, allowed=allowed(Cause.MESSAGE_DIFFERS), detail=verdict.detail
            )

    if escaping:
        out += _escaped_spots(rules, native_ids, allowed, deadline)
    return sorted(out, key=lambda f: (f.stream.start, f.cause.value))


def _divergent_spans(rules: RuleContext, explained: set[int]) -> list[Span5]:
    """``(i1, i2, j1, j2, segment)`` of every divergence worth a finding: not the trailing generation prompt of a turn
    that never ran, not what follows a cut by the response length, not the END close and trailer, not what the
    turn-end findings already explained."""
    stream, native = rules.stream, rules.rendered
    spans: list[Span5] = []
    for (tag, i1, i2, j1, j2), seg in zip(rules.opcodes, rules.owners, strict=True):
        if tag == "equal" or i1 == rules.prompt_cut < len(stream):
            continue
        if i2 == len(stream) and j2 < len(native) and not rules.parts[seg].sampled and rules.cut_inside(i1, j1):
            continue  # the trainer's response length cut the context here: nothing after the cut is trained
        if i2 == len(stream) and j2 == len(native):
            # Nothing is trained after the last token: the END close and trailer the template renders there (and
            # a stream cut before them) change nothing. Compare what comes before them.
            j2 -= rules.end_close_suffix(native[j1:j2])
            if i1 == i2:
                continue  # rendered-only text after the last stream token (a response cut inside context)
        if i1 < i2 and j1 == j2 and all(i in explained for i in range(i1, i2)):
            continue
        spans.append((i1, i2, j1, j2, seg))
    return spans


def _one_per_call(rules: RuleContext, spans: list[Span5]) -> list[Span5]:
    """``spans`` with the divergences that lie inside one call block of a sampled turn (on both sides, the message
    holding the turn's calls) joined into one: a call the template re-serializes is one finding, not one per space
    its JSON writes otherwise (a compact call drew four; explaining each cost more than the render)."""
    out: list[Span5] = []
    block: tuple[int, int] | None = None
    several = Counter(seg for *_, seg in spans)
    for i1, i2, j1, j2, seg in spans:
        part, here = rules.parts[seg], None
        if part.sampled and several[seg] > 1:
            call = rules.loc.calls[part.turn]
            # inside the turn's output, off its end: a turn-end divergence is the close's, never a call's
            if call.output_start <= i1 < i2 < call.output_end:
                here = rules.call_block_at(part, i1, i2, j1, j2)
        if here is not None and out and block == here and out[-1][4] == seg:
            out[-1] = (out[-1][0], i2, out[-1][2], j2, seg)
        else:
            out.append((i1, i2, j1, j2, seg))
        block = here
    return out


def _escaped_spots(
    rules: RuleContext, native: Sequence[int], allowed: Callable[[Cause], bool], deadline: float | None
) -> list[Finding]:
    """Where the native render makes special tokens of content text that the stream (and the escaped render it is
    compared with) keeps as text: one allowed ``SPECIAL_TOKEN_ESCAPED`` finding each, at the stream's span."""
    out: list[Finding] = []
    escaped = rules.rendered
    for tag, a1, a2, b1, b2 in align(escaped, native, deadline):
        if tag != "replace" or rules.r.decode(escaped[a1:a2]) != rules.r.decode(native[b1:b2]):
            continue
        i1 = rules.stream_index(a1, a2)
        if i1 is None:
            continue  # the stream differs there anyway: the template view's own finding says how
        i2 = i1 + (a2 - a1)
        detail = "special-token text in content kept as text, as the engine saw it"
        cause = Cause.SPECIAL_TOKEN_ESCAPED
        out.append(rules.loc.finding(cause, allowed(cause), Span(i1, i2), Span(b1, b2), native[b1:b2], detail))
    return out
