"""Template view: render the final messages with the chat template, align, and explain each divergence.

The training stream is the engine's tokens; the re-render is what ``apply_chat_template`` would give for
the same conversation. Where they differ, a rule names the cause. Rules look at tokens and the template
profile only (never at a model name); ``RULES`` lists them in order, one function per cause, and the first that
names a cause wins. What no rule explains is ``UNKNOWN``.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.check.align import Opcode, align, check_deadline
from verl_ext.check.call_spacing import (
    cuts_a_marker,
    differing_whitespace,
    form_markers,
    spacing_place,
    whitespace_only,
    with_plain_tags,
)
from verl_ext.check.decode_memo import MemoDecode
from verl_ext.check.fact_renders import with_tools_if_needed
from verl_ext.check.findings import ALLOWED_BY_DESIGN, Cause, Finding, Span
from verl_ext.check.locate import Locator
from verl_ext.check.message_shape import SLOT, message_shape
from verl_ext.check.sampled_text import TurnVerdict, frame_runs, json_and_text, message_holds_sampled
from verl_ext.check.segments import Segment, segment_opcodes, segments
from verl_ext.check.tool_call_compare import (
    CallsReading,
    call_markers,
    read_calls,
    without_blocks,
    without_python_calls,
)
from verl_ext.core.bounded_cache import LruCache
from verl_ext.core.call_reader import learn_call_reader, parameter_types
from verl_ext.core.call_reader.literals import MARKER
from verl_ext.core.errors import TemplateError
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_profile import END, TemplateProfile
from verl_ext.core.text_cut import spec_components


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
    rules = _Rules(loc, profile, renderer, messages, stream, native, deadline, tools)
    out: list[Finding] = []
    spans = _divergent_spans(rules, explained)
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


def _divergent_spans(rules: _Rules, explained: set[int]) -> list[tuple[int, int, int, int, int]]:
    """``(i1, i2, j1, j2, segment)`` of every divergence worth a finding: not the trailing generation prompt of a turn
    that never ran, not what follows a cut by the response length, not the END close and trailer, not what the
    turn-end findings already explained."""
    stream, native = rules.stream, rules.rendered
    spans: list[tuple[int, int, int, int, int]] = []
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


class _Rules:
    """What every rule reads besides the divergent span: the stream, the render, their alignment (computed once),
    the template profile, and helpers over them."""

    def __init__(
        self,
        loc: Locator,
        profile: TemplateProfile,
        renderer: ChatRenderer,
        messages: Sequence[Mapping[str, Any]],
        stream: Sequence[int],
        rendered: Sequence[int],
        deadline: float | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.loc = loc
        self.tools = tools
        self.messages = messages
        self.profile = profile
        # decode memoized per check: the rules of a turn's findings decode the same short spans again and again
        self.r: ChatRenderer = MemoDecode(renderer)  # type: ignore[assignment]
        self.stream = stream
        self.rendered = rendered
        self.closes = profile.close_id_set
        self.turn_ends = profile.turn_end_id_set
        self.aliases = profile.alias_id_set
        self.stops = profile.stop_id_set
        self.assistants = [messages[i] for i in loc.assistant_indices]
        self.index = loc.index  # the calls by output start and end: a finding asks about its own turn, not every call
        outputs = [(c.output_start, c.output_end) for c in loc.calls]
        tail = self.end_close_suffix(rendered[-_END_LOOKBACK:])
        # A rollout that ran out of budget right after its context ends on the generation prompt of a turn that never
        # ran: the final messages do not render it, and nothing was sampled after it. Compared apart, then skipped.
        self.prompt_cut = _trailing_generation_prompt(stream, profile.generation_prompt_ids, outputs)
        after = bool(loc.next_roles) and loc.next_roles[-1] != "end"
        context = stream[outputs[-1][1] : self.prompt_cut] if outputs else ()
        end = profile.boundary(END)
        trims = {0, tail, len(end.trailer_ids), len(end.close_ids)}  # the render may end in the END close, trailer
        if after and not any(_context_ends_like(context, rendered[: len(rendered) - t]) for t in trims):
            # The cut is inside the context after the last turn (Seed-OSS opens a user message with the <seed:bos>
            # its generation prompt starts with): the response length cut a message, not a generation prompt.
            self.prompt_cut = len(stream)
        prefill = len(profile.generation_prompt_ids)
        self.parts = segments(
            stream[: self.prompt_cut],
            rendered,
            outputs,
            self.turn_ends,
            tail,
            deadline,
            prefill,
            renderer.control_ids,
            messages_after_last_turn=after,
        )
        if self.prompt_cut < len(stream):
            self.parts.append(Segment(self.prompt_cut, len(stream), len(rendered), len(rendered)))
        # the alignment, segment by segment: computed once, read by every rule
        self.opcodes, self.owners = segment_opcodes(stream, rendered, self.parts, deadline)
        self._verdicts: dict[int, TurnVerdict] = {}
        self._call_readings: dict[int, CallsReading | None] = {}
        self._texts: dict[tuple[bool, int, int], str] = {}
        # per side, the decoded spans as (start, end, order decoded), by start: ``_known_inside`` looks in its range
        self._decoded: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self._prefill_tails: dict[int | None, tuple[tuple[int, ...], ...]] = {}
        self._block_counts: dict[tuple[str, bool], tuple[int, int]] = {}  # ``_counts``
        self._calls_equal: dict[int, bool] = {}  # ``_tool_calls_equal``, per turn
        # ``prefix``: per side and start, the prefixes read so far as (end, characters, brace depth, ends cut), by end
        self._prefixes: dict[tuple[bool, int], list[tuple[int, int, int, bool]]] = {}
        self._turn_starts: dict[int | None, tuple[int, int]] = {}  # ``turn_spans``

    def texts(self, spans: Sequence[tuple[bool, int, int]]) -> list[str]:
        """The text of each ``(in_stream, start, end)`` span (of the stream, else of the render), every span decoded
        once per check and the new ones in one batch. Where the tokenizer's decode joins (``decode_joins``), a span
        holding one already decoded (a turn holding the thinking block its divergence read) decodes only the rest."""
        known = self._texts
        if all(span in known for span in spans):
            return [known[span] for span in spans]  # a turn's texts, asked again by each of its findings
        new = [span for span in dict.fromkeys(spans) if span not in self._texts]
        pieces = {span: self._known_inside(span) for span in new}
        wanted = list(dict.fromkeys(piece for span in new for piece in pieces[span] if piece not in self._texts))
        if wanted:
            for piece, text in zip(wanted, self.r.decode_many([self._ids(piece) for piece in wanted]), strict=True):
                self._remember(piece, text)
        for span in new:
            parts = [self._texts[piece] for piece in pieces[span]]
            cut = any(
                left.endswith("\ufffd") or right.startswith("\ufffd") for left, right in itertools.pairwise(parts)
            )
            self._remember(span, self.r.decode(self._ids(span)) if cut else "".join(parts))
        return [self._texts[span] for span in spans]

    def _remember(self, span: tuple[bool, int, int], text: str) -> None:
        """Keep ``span``'s text, and where a new span is, in decoding order (``_known_inside`` reads it)."""
        if span not in self._texts:
            in_stream, a, b = span
            bisect.insort(self._decoded[in_stream], (a, b, len(self._texts)))
        self._texts[span] = text

    def prefix(self, in_stream: bool, a: int, b: int) -> tuple[int, int]:
        """(the length in characters, the count of ``{`` less the count of ``}``) of the text of ``[a, b)`` of the
        stream (else of the render): what the rules explaining a turn's findings ask of the text from the turn's start
        to each finding, read once per span. Where decode joins (``decode_joins``), a span extends the longest one
        read from ``a`` before ``b`` by the text of the rest only (each finding of a turn decodes the few tokens
        since the one before, not the turn's text up to it); else decoded whole."""
        if b <= a:
            return 0, 0
        known = self._prefixes.setdefault((in_stream, a), [])
        k = bisect.bisect_right(known, (b, float("inf")))
        if k and known[k - 1][0] == b:
            return known[k - 1][1], known[k - 1][2]
        ids = self.stream if in_stream else self.rendered
        if k and self.r.decode_joins and not known[k - 1][3]:
            c, chars, depth, _ = known[k - 1]
            rest = self.r.decode(ids[c:b])
            if not rest.startswith("\ufffd"):
                entry = (b, chars + len(rest), depth + rest.count("{") - rest.count("}"), rest.endswith("\ufffd"))
                known.insert(k, entry)
                return entry[1], entry[2]
        text = self.r.decode(ids[a:b])
        entry = (b, len(text), text.count("{") - text.count("}"), text.endswith("\ufffd"))
        known.insert(k, entry)
        return entry[1], entry[2]

    def _ids(self, span: tuple[bool, int, int]) -> Sequence[int]:
        in_stream, a, b = span
        return (self.stream if in_stream else self.rendered)[a:b]

    def _known_inside(self, span: tuple[bool, int, int]) -> list[tuple[bool, int, int]]:
        """``span`` as pieces: the longest span already decoded inside it with what lies before and after it, where
        decode joins; else ``span`` itself."""
        in_stream, a, b = span
        if not self.r.decode_joins:
            return [span]
        # the spans decoded so far that start in [a, b): bisected, not every span of the check
        known = self._decoded[in_stream]
        lo, hi = bisect.bisect_left(known, (a,)), bisect.bisect_left(known, (b,))
        inside = [(x, y, n) for x, y, n in known[lo:hi] if x < y <= b and (x, y) != (a, b)]
        if not inside:
            return [span]
        # the longest, the first decoded of equal ones (as a scan of the spans in decoding order finds it)
        x, y, _ = min(inside, key=lambda k: (k[0] - k[1], k[2]))
        return [piece for piece in ((in_stream, a, x), (in_stream, x, y), (in_stream, y, b)) if piece[1] < piece[2]]

    def cut_inside(self, i1: int, j1: int) -> bool:
        """The stream ends at ``i1``'s divergence with a prefix of what the render holds from ``j1`` on: the trainer's
        response length cut the rollout there (nothing after the cut is trained)."""
        ours = self.r.decode(self.stream[i1:])
        return bool(ours) and self.r.decode(self.rendered[j1:]).startswith(ours)

    def inside_turn(self, d: Divergence, part: Segment) -> bool:
        """The divergence belongs to the sampled turn of ``part``: it lies in the turn's output, or its part in the gap
        next to it (an edge token whose text merged with the sampled text in the render) is intact in the render."""
        call = self.loc.calls[part.turn]
        s, e = call.output_start, call.output_end
        touches = s < d.i2 and d.i1 < e if d.i1 < d.i2 else s <= d.i1 <= e
        if not touches and not (d.i1 <= d.i2 <= s and self._in_prefill(d, s)):
            return False  # entirely in the gap's edge next to the turn: the gap's
        lead = self.r.decode(self.stream[d.i1 : min(d.i2, call.output_start)]) if d.i1 < call.output_start else ""
        trail = self.r.decode(self.stream[max(d.i1, call.output_end) : d.i2]) if d.i2 > call.output_end else ""
        closed_apart = d.i2 == call.output_end + len(self._inserted_close(part.turn)) and self._unclosed(part)
        return (d.dr.startswith(lead) or self._in_prefill(d, call.output_start)) and (
            d.dr.endswith(trail) or closed_apart
        )

    def _inserted_close(self, turn: int) -> tuple[int, ...]:
        """The close verl_ext inserted after the turn's output (mask 0), as the template writes it for the message
        that follows; empty when the turn ended on its own end-of-turn token or nothing was inserted."""
        call = self.loc.calls[turn]
        if call.output_ids and call.output_ids[-1] in self.turn_ends:
            return ()
        role = self.loc.next_roles[turn] if turn < len(self.loc.next_roles) else END
        try:
            close = self.profile.boundary(role).close_ids
        except TemplateError:
            return ()
        end = call.output_end
        return close if close and tuple(self.stream[end : end + len(close)]) == close else ()

    def _closed_after(self, d: Divergence) -> bool:
        """The divergence ends where a turn's output ends, and verl_ext's close for the turn follows it: the render's
        close inside the span is one the template writes within the message (DeepSeek-R1 closes the tool calls, then
        writes the content as one more part), not the turn's missing close."""
        return d.i1 < d.i2 and any(self._inserted_close(k) for k in self.index.ending_at(d.i2))

    def _unclosed(self, part: Segment) -> bool:
        """The template writes the turn's message without an end-of-turn token (Seed-OSS writes nothing for an
        assistant message with no content and no call), while the stream holds the turn's close: sampled, or
        inserted by verl_ext, as the engine saw it in every later prompt."""
        call = self.loc.calls[part.turn]
        closed = bool(call.output_ids) and call.output_ids[-1] in self.turn_ends
        has_close = closed or bool(self._inserted_close(part.turn))
        return has_close and not any(t in self.turn_ends for t in self.rendered[part.j1 : part.j2])

    def _in_prefill(self, d: Divergence, output_start: int) -> bool:
        """The divergence's part before the turn's output lies in the prompt's tail the template does not write
        once the turn is history (a generation prompt's pre-fill; see ``_prefills``)."""
        turn = self.index.first_starting_at(output_start)
        for tail in self._prefills(turn):
            begin = output_start - len(tail)
            if begin <= d.i1 < output_start and tuple(self.stream[begin:output_start]) == tail:
                return True
        return False

    def _prefills(self, turn: int | None) -> tuple[tuple[int, ...], ...]:
        """The prompt tails before ``turn``'s output that the template may not write once the turn is history: its
        generation prompt (whose pre-fill, Qwen3's empty think block with thinking off, it drops), and what it wrote
        after the message before the turn that it does not write once this kind of assistant message follows
        (DeepSeek-R1 closes its tool outputs block with ``<｜tool▁outputs▁end｜>`` before a generation, and writes
        the next tool-call turn into the block instead). Computed once per turn."""
        if turn not in self._prefill_tails:
            self._prefill_tails[turn] = self._prompt_tails_before(turn)
        return self._prefill_tails[turn]

    def _prompt_tails_before(self, turn: int | None) -> tuple[tuple[int, ...], ...]:
        gen = tuple(self.profile.generation_prompt_ids)
        if turn is None or turn >= len(self.loc.assistant_indices):
            return (gen,) if gen else ()
        at = self.loc.assistant_indices[turn]
        role = str(self.messages[at - 1].get("role", "")) if 0 < at <= len(self.messages) else ""
        calls = bool(self.messages[at].get("tool_calls")) if at < len(self.messages) else False
        tail = _prompt_tail(self.r, self.profile, role, calls) if role in _PROMPT_CONTEXTS else ()
        return tuple(t for t in dict.fromkeys((gen, tail)) if t)

    def sampled_cause(self, d: Divergence, part: Segment, cause: Cause, detail: str) -> tuple[Cause, str]:
        """The cause of a divergence inside a sampled turn. The stream is the engine's there: a rule's innocent
        reading stands, and so do the turn-end defects (a close or trailer the stream lacks); anything else is the
        template writing the same message its own way when the message holds what was sampled (``verdict``), and
        ``MESSAGE_DIFFERS`` when it does not."""
        named = self._call_spacing(d, part, cause) or self._call_cause(d, part, cause)
        if named is not None:
            return named
        if (
            cause in ALLOWED_BY_DESIGN
            or cause is Cause.STOP_TEXT_IN_MESSAGE
            or (cause in _TURN_END_DEFECTS and d.at_end)
        ):
            return cause, detail
        start = self.loc.calls[part.turn].output_start
        if d.i1 == start and not d.s_ids and not self.prompt_intact(start):
            # Render-only text where the output starts: the template's own text before the content (a think block
            # it inserts) only follows its whole generation prompt; here verl_ext wrote another prompt.
            return cause, detail
        verdict = self.verdict(part)
        if not verdict.holds:
            return Cause.MESSAGE_DIFFERS, verdict.detail
        if self._unclosed(part) and not any(t in self.turn_ends for t in d.r_ids):
            inserted = self._inserted_close(part.turn)
            if inserted and d.i2 == self.loc.calls[part.turn].output_end + len(inserted):
                return Cause.SYNTHETIC_CLOSE, (
                    f"the template writes this message without a close ({d.dr!r} where the stream has {d.ds!r}); "
                    f"the close verl_ext inserted (mask 0) stays, as the engine saw it in every later prompt"
                )
            if any(t in self.turn_ends for t in d.s_ids):
                return Cause.SAMPLED_TEXT_KEPT, (
                    f"the template writes this message without a close ({d.dr!r} where the engine sampled "
                    f"{d.ds!r}); the stream keeps the sampled close"
                )
        if d.i1 < start and self._in_prefill(d, start):
            return Cause.PREFILL_DROPPED, (
                f"the prompt the engine saw ends in text the template does not write before this turn once it is "
                f"history (a generation prompt's pre-fill, a block it closes only before a generation); the stream "
                f"keeps {d.ds[:80]!r} as the engine saw and sampled it"
            )
        if _squash(d.ds) == _squash(d.dr):
            return Cause.CONTENT_WHITESPACE, f"the template writes {d.dr!r} where the engine sampled {d.ds!r}"
        if any(tag in d.ds or tag in d.dr for tag in self._reasoning_tags):
            return Cause.REASONING_REFORMATTED, (
                f"the template re-writes the turn's thinking: {d.dr[:80]!r} where the engine sampled {d.ds[:80]!r}"
            )
        return Cause.SAMPLED_TEXT_KEPT, (
            f"the message holds what was sampled; the template writes {d.dr[:80]!r} where the engine sampled "
            f"{d.ds[:80]!r}"
        )

    def turn_spans(self, part: Segment) -> list[tuple[bool, int, int]]:
        """The spans of a sampled turn's two texts (``texts``): ``part``, its start moved back over the tokens both
        sides share before it where a tag-shaped marker starts in them and ends in the turn (``cuts_a_marker``);
        computed once per turn."""
        if part.turn not in self._turn_starts:
            i, j, back = part.i1, part.j1, 0
            for k in range(1, min(i, j, _SHARED_LOOKBACK) + 1):
                if self.stream[i - k] != self.rendered[j - k]:
                    break
                texts = self.texts([(True, i, part.i2), (False, j, part.j2)])
                if cuts_a_marker(self.r.decode(self.stream[i - k : i]), texts):
                    back = k
                    break
            self._turn_starts[part.turn] = (i - back, j - back)
        i, j = self._turn_starts[part.turn]
        return [(True, i, part.i2), (False, j, part.j2)]

    def prompt_intact(self, start: int) -> bool:
        """The stream holds the template's whole generation prompt right before the output at ``start`` (what
        verl_ext wrote before each engine call); true where the template has none."""
        gen = tuple(self.profile.generation_prompt_ids)
        return not gen or tuple(self.stream[max(start - len(gen), 0) : start]) == gen

    def verdict(self, part: Segment) -> TurnVerdict:
        """Whether the turn's message holds what the engine sampled, once per turn: its tool calls by meaning, block
        by block (``tool_call_compare``), where the template writes per-call markers, and calls in Python form by
        value; the rest of the text (or all of it, without such markers) by ``sampled_text``."""
        if part.turn not in self._verdicts:
            sampled, rendered = self.texts(self.turn_spans(part))
            reading = self.call_reading(part)
            if reading is not None and not reading.holds:
                self._verdicts[part.turn] = TurnVerdict(False, reading.detail)
                return self._verdicts[part.turn]
            if reading is not None:
                sampled, rendered = without_blocks(sampled, reading.sampled), without_blocks(rendered, reading.rendered)
            sampled, rendered = without_python_calls(sampled, rendered)
            frame, shapes = self._frame, ()
            if part.turn < len(self.assistants):
                runs = message_shape(self.r, self.profile, self.assistants[part.turn])
                frame = frame | {run for run in runs if not SLOT.search(run)}
                shapes = tuple(SLOT.split(run) for run in runs if SLOT.search(run))
            self._verdicts[part.turn] = message_holds_sampled(
                sampled, rendered, self._structure, frame, self._normalized, shapes, self._reasoning_closes
            )
        return self._verdicts[part.turn]

    def call_reading(self, part: Segment) -> CallsReading | None:
        """The turn's tool calls read against its sampled and rendered text (``tool_call_compare``), once per turn;
        None where its message has no calls, or the template writes neither per-call markers nor several calls in
        one list. The calls are located by the reader the loop reads turns with (derived from the template,
        ``learn_call_reader``, cached), the template's markers only where none is derived."""
        if part.turn not in self._call_readings:
            calls = (self.assistants[part.turn].get("tool_calls") if part.turn < len(self.assistants) else None) or []
            sampled, rendered = self.texts(self.turn_spans(part))
            # A template that writes no per-call markers but several calls in one list (Mistral's one [TOOL_CALLS]
            # JSON list: the list is ordered) is read by its reader alone. One that cannot render two calls in a
            # message keeps the verdict of ``sampled_text`` alone (GPT-OSS: one call per message).
            markers = _call_markers(self.r, self.profile)
            reader = learn_call_reader(self.r, self.profile).reader
            if reader is not None and markers is None and not reader.form.several:
                reader = None
            self._call_readings[part.turn] = read_calls(
                sampled, rendered, calls, markers, reader, self._parameter_types
            )
        return self._call_readings[part.turn]

    def _call_spacing(self, d: Divergence, part: Segment, cause: Cause) -> tuple[Cause, str] | None:
        """Whitespace only, at a place around the turn's calls (``call_spacing``: before the first, between two,
        after the last, before the close), on a turn whose message holds its calls: the template spacing the calls
        the parser read its own way, named with the place. Found on the texts, so whitespace the tokenizer merged
        into a plain-text marker's last token (``>`` against ``>\n``) is found too. A rule's reading of the same text
        in other ids, and a turn-end defect, stand."""
        if cause in _SAME_TEXT or (cause in _TURN_END_DEFECTS and d.at_end) or not whitespace_only(d.ds, d.dr):
            return None
        reading = self.call_reading(part)
        if reading is None or not self.verdict(part).holds:
            return None
        call = self.loc.calls[part.turn]
        start = call.output_start
        first = start if d.i1 < start and self._in_prefill(d, start) else d.i1
        i1 = self.turn_spans(part)[0][1]
        at = self.prefix(True, i1, max(first, i1))[0]
        at += len(os.path.commonprefix([d.ds, d.dr])) if first == d.i1 else 0
        blocks = [b for b in reading.sampled if b.closed or b.call is not None]
        after = [i for i in self.stream[d.i2 : call.output_end] if i not in self.turn_ends]
        place = spacing_place(blocks, at, closing=not after or not self.r.decode(after).strip())
        if place is None:
            return None
        wrote, saw = differing_whitespace(d.dr, d.ds)
        return Cause.TOOL_CALL_RESERIALIZED, (
            f"whitespace only, {place}: the template writes {wrote!r} where the stream has {saw!r} (the message holds "
            "the calls as sampled)"
        )

    def _call_cause(self, d: Divergence, part: Segment, cause: Cause) -> tuple[Cause, str] | None:
        """A divergence inside the turn's call blocks, and nothing but whitespace outside them, on a turn whose message
        holds its calls: the template re-serializing a call the parser read (``TOOL_CALL_RESERIALIZED``), or the text
        of a call it could not read, kept as sampled (``MALFORMED_TOOL_CALL``). A rule's reading of the same text in
        other ids, and a turn-end defect, stand."""
        if cause in _SAME_TEXT or (cause in _TURN_END_DEFECTS and d.at_end):
            return None
        reading = self.call_reading(part)
        if reading is None or not self.verdict(part).holds:
            return None
        (_, i1, _), (_, j1, _) = spans = self.turn_spans(part)
        sampled, rendered = self.texts(spans)
        start = self.loc.calls[part.turn].output_start
        # the generation prompt's pre-fill before the output (an empty think block) is the prompt's, not the message's
        first = start if d.i1 < start and self._in_prefill(d, start) else d.i1
        a, b = (self.prefix(True, i1, i)[0] for i in (max(first, i1), max(d.i2, i1)))
        ra, rb = (self.prefix(False, j1, j)[0] for j in (max(d.j1, j1), max(d.j2, j1)))
        hit = [x for x in reading.sampled if x.start <= b and a <= x.end and (x.closed or x.call is not None)]
        outside = _only_blocks(sampled, a, b, reading.sampled) and _only_blocks(rendered, ra, rb, reading.rendered)
        if not hit or not outside:
            return None
        malformed = [blk for blk in hit if blk.malformed]
        if malformed:
            text = sampled[malformed[0].start : malformed[0].end]
            return Cause.MALFORMED_TOOL_CALL, (
                f"a tool call the parser could not read, {text[:80]!r}, is not in the message; the stream keeps it as "
                "sampled (the loop answers it with an error tool message)"
            )
        return Cause.TOOL_CALL_RESERIALIZED, (
            f"the template re-serializes a tool call the message holds as sampled (same name and values): it writes "
            f"{d.dr[:80]!r} where the engine sampled {d.ds[:80]!r}"
        )

    @functools.cached_property
    def _parameter_types(self) -> dict[str, dict[str, str]]:
        """Parameter types per tool (the reader keeps a declared string parameter a string), read once per rollout."""
        return parameter_types(self.tools or ())

    @functools.cached_property
    def _frame(self) -> frozenset[str]:
        return _assistant_frame(self.r)[0]

    @functools.cached_property
    def _structure(self) -> re.Pattern[str] | None:
        """Control-token text, and the template's reasoning tags and call markers where they are plain text."""
        markers = (*(_call_markers(self.r, self.profile) or ()), *form_markers(self.r, self.profile))
        return with_plain_tags(self.r.control_pattern, (*self._reasoning_tags, *markers))

    @functools.cached_property
    def _reasoning_tags(self) -> tuple[str, ...]:
        return _assistant_frame(self.r)[1]

    @functools.cached_property
    def _reasoning_closes(self) -> tuple[str, ...]:
        return _assistant_frame(self.r)[2]

    def end_close_suffix(self, ids: Sequence[int]) -> int:
        """How many of ``ids``' last tokens are the template's END close and/or trailer (0 if none)."""
        end = self.profile.boundary(END)
        ids = tuple(ids)
        for tail in (end.close_ids + end.trailer_ids, end.trailer_ids, end.close_ids):
            if tail and ids[-len(tail) :] == tail:
                return len(tail)
        return 0

    def classify(self, i1: int, i2: int, j1: int, j2: int) -> tuple[Cause, str]:
        """The cause and detail of the divergence ``stream[i1:i2]`` vs ``rendered[j1:j2]``: the first rule of
        ``RULES`` that names one, else ``UNKNOWN`` with both texts."""
        return self.explain(Divergence.of(self, i1, i2, j1, j2))

    def explain(self, d: Divergence) -> tuple[Cause, str]:
        """``classify`` for a divergence already built."""
        for rule in RULES:
            named = rule(d)
            if named is not None:
                return named
        return Cause.UNKNOWN, f"stream {d.ds!r} vs template {d.dr!r}"

    def _moved(self, ds: str, dr: str, region: str) -> str:
        """The text of a one-sided divergence (only in the stream, or only in the render) in the prompt or the context
        when the other side holds it elsewhere: a moved block, not a lost or an added one. In the context, a block
        one side holds more often than the other is duplicated, not moved. Short texts never count."""
        if bool(ds) == bool(dr) or region not in ("prompt", "context", "boundary"):
            return ""
        text = (ds or dr).strip()
        if len(text) < _MOVED_MIN_CHARS:
            return ""  # before the whole texts are read: decoding them costs more than the rest of the check
        held, mine = self._counts(text, bool(ds))
        if not held:
            return ""
        # The first prompt is what the engine saw first: a block the template later renders elsewhere moved there.
        if region == "prompt" or mine <= held:
            return text
        # The tool list a template writes before the last user message (Mistral): each user turn the engine saw had
        # one before it, the final render has one. A copy of message content is duplicated, not moved.
        return text if self._tool_list_block(text) else ""

    def _counts(self, text: str, in_stream: bool) -> tuple[int, int]:
        """How often the other side's whole text holds ``text``, and how often its own side's does (lazily: the second
        only where the first is not 0); once per text and side per check: a block moved in every turn (Mistral's tool
        list, before each question) is one text, counted once, not once per turn over the whole rollout."""
        key = (text, in_stream)
        if key not in self._block_counts:
            mine, other = (
                (self._stream_text, self._rendered_text) if in_stream else (self._rendered_text, self._stream_text)
            )
            held = other.count(text)
            self._block_counts[key] = (held, mine.count(text) if held else 0)
        return self._block_counts[key]

    def _tool_list_block(self, text: str) -> bool:
        """``text`` is written by the template for the tool schemas: its render of the first message holds it with
        the tools and not without them."""
        with_tools, without = self._first_message_renders
        return text in with_tools and text not in without

    @functools.cached_property
    def _first_message_renders(self) -> tuple[str, str]:
        if not self.tools or not self.messages:
            return "", ""
        first = [dict(self.messages[0])]
        try:
            return self.r.render_text(first, self.tools), self.r.render_text(first, None)
        except Exception:  # a template that cannot render its first message alone: no tool list known
            return "", ""

    @functools.cached_property
    def _rendered_text(self) -> str:
        return self.r.decode(self.rendered)

    @functools.cached_property
    def _stream_text(self) -> str:
        return self.r.decode(self.stream)

    def _call_names_swapped(self, ds: str, dr: str) -> bool:
        """Both sides are names of tool calls one assistant turn made, and they differ."""
        a, b = ds.strip(_NAME_EDGE), dr.strip(_NAME_EDGE)
        if not a or not b or a == b:
            return False
        return (a, b) in self._call_name_pairs

    @functools.cached_property
    def _call_name_pairs(self) -> frozenset[tuple[str, str]]:
        """Every ordered pair of two names of tool calls that one assistant message makes (read once per check)."""
        pairs: set[tuple[str, str]] = set()
        for m in self.assistants:
            names = {
                str((c.get("function") or c).get("name", ""))
                for c in m.get("tool_calls") or []
                if isinstance(c, Mapping)
            }
            pairs.update((x, y) for x in names for y in names if x != y)
        return frozenset(pairs)

    def _prefill_dropped(self, i1: int, i2: int) -> str | None:
        """A stream-only span that starts in the generation prompt right before a turn's output and is the end of
        it: "prefill" when it stops there, "prefill and sampled" when it runs on into the turn's output."""
        # only a turn whose output starts within the longest pre-fill after i1 can hold i1 in its pre-fill
        for turn in self.index.starting_within(i1 + 1, i1 + self._prefill_reach):
            c = self.loc.calls[turn]
            start = c.output_start
            for gen in self._prefills(turn):
                # The prompt the engine saw ends with it, intact (a pre-fill written twice is not one).
                if (
                    not start - len(gen) <= i1 < start
                    or i2 > c.output_end
                    or tuple(self.stream[start - len(gen) : start]) != gen
                ):
                    continue
                head = tuple(self.stream[i1:start] if i2 > start else self.stream[i1:i2])
                if i2 <= start and any(gen[k : k + len(head)] == head for k in range(len(gen) - len(head) + 1)):
                    return "prefill"
                if i2 > start and gen[len(gen) - len(head) :] == head:
                    return "prefill and sampled"
        return None

    def within_reasoning(self, i1: int, i2: int) -> bool:
        """The stream span ``[i1, i2)`` ends inside its turn's reasoning: the turn's output up to ``i2`` ends at or
        before the end of the last reasoning close the engine sampled in the turn (and the whitespace after it), or in
        text the render keeps there. A turn with no sampled close has no reasoning the template can strip (a turn that
        starts inside a pre-filled or empty think block is not reasoning after it), so nothing of it is excused so."""
        call = self.loc.calls[self.loc.turn(max(i2 - 1, i1))]
        start = call.output_start
        if i2 <= start:
            return False
        (turn,) = self.texts([(True, start, call.output_end)])
        ends = [turn.rfind(c) + len(c) for c in self._strip_closes if c in turn]
        if not ends:
            return False
        end = max(ends)
        end += len(turn[end:]) - len(turn[end:].lstrip())
        (head,) = self.texts([(True, start, min(i2, call.output_end))])
        # a token that merges the close's whitespace with the next text ("\n\n<") ends a little after it
        return len(head) <= end or not head[end:].strip()

    @functools.cached_property
    def _strip_closes(self) -> tuple[str, ...]:
        """The texts that end reasoning the template may strip: its reasoning closes, and the close of an opener its
        generation prompt pre-fills (QwQ and R1 keep only what follows "</think>" of the content)."""
        opener = re.search(r"<([A-Za-z_][\w:.-]*)>\s*$", self.r.decode(self.profile.generation_prompt_ids))
        return (*self._reasoning_closes, *([f"</{opener.group(1)}>"] if opener else []))

    @functools.cached_property
    def _prefill_reach(self) -> int:
        """The longest prompt tail before any turn that the template may not write once it is history."""
        return max((len(t) for k in range(len(self.loc.calls)) for t in self._prefills(k)), default=0)

    def _assistant_texts(self) -> set[str]:
        """Stop-token strings that appear in assistant message content (read once per check)."""
        return self._stop_texts_in_content

    @functools.cached_property
    def _stop_texts_in_content(self) -> set[str]:
        texts = " ".join(str(m.get("content") or "") for m in self.assistants)
        return {self.r.decode([i]) for i in self.stops if self.r.decode([i]) in texts}

    def _normalized(self, text: str) -> str:
        """``text`` as the tokenizer's own normalizer leaves it (Qwen: NFC); unchanged when it has none."""
        normalizer = getattr(self.r.tokenizer.backend_tokenizer, "normalizer", None)
        if normalizer is None or (text.isascii() and self._unicode_forms_only):
            return text  # every Unicode normal form leaves ASCII as it is
        return normalizer.normalize_str(text)

    def _same_after_last_match(self, d: Divergence) -> bool:
        """The two spans read the same (once normalized) after the token before them, where that token is the same on
        both sides. A span decoded alone can lose text: SentencePiece decodes a leading "▁" as nothing, so a space
        token a loop added (re-encoding decoded text) reads as no text at all."""
        if not d.i1 or not d.j1 or self.stream[d.i1 - 1] != self.rendered[d.j1 - 1]:
            return True
        before = self.stream[d.i1 - 1]
        return self._same_normalized(self.r.decode([before, *d.s_ids]), self.r.decode([before, *d.r_ids]))

    def _same_normalized(self, a: str, b: str) -> bool:
        """``_normalized(a) == _normalized(b)``. Where one text is empty and the normalizer is Unicode normalization
        only (which keeps every non-empty text non-empty), they differ without normalizing the other: a thinking
        block the template drops is tens of thousands of characters."""
        if (not a) != (not b) and self._unicode_forms_only:
            return False
        return self._normalized(a) == self._normalized(b)

    @functools.cached_property
    def _unicode_forms_only(self) -> bool:
        """The tokenizer's normalizer is Unicode normalization only (its state parsed once per check)."""
        return _unicode_forms_only(self.r.tokenizer.backend_tokenizer.normalizer)

    def _all_sampled(self, i1: int, i2: int) -> bool:
        """Every stream position in ``[i1, i2)`` is a token the engine sampled (in some call's output)."""
        return self.index.covers(i1, i2)

    def _touches_turn_end(self, i1: int, i2: int) -> bool:
        return self.index.end_within(i1, max(i1, i2))

    def _at_turn_start(self, position: int) -> bool:
        return self.index.starts_at(position)

    def _at_turn_end(self, position: int) -> bool:
        return self.index.ends_at(position)

    def _inside_json(self, turn: int, position: int) -> bool:
        """The divergence starts inside a JSON object of the sampled text (or at its opening brace)."""
        return (
            self.prefix(True, self.loc.calls[turn].output_start, position)[1] > 0
            or self.r.decode(self.stream[position : position + 1]) == "{"
        )

    def _tool_calls_equal(self, turn: int) -> bool:
        """The turn's tool-call JSON objects parse equal on both sides (only their text differs); read once per turn
        (every re-serialized spot of a call is a finding of its own)."""
        if turn not in self._calls_equal:
            self._calls_equal[turn] = self._parsed_calls_equal(turn)
        return self._calls_equal[turn]

    def _parsed_calls_equal(self, turn: int) -> bool:
        if turn >= len(self.assistants) or not self.assistants[turn].get("tool_calls"):
            return False
        call = self.loc.calls[turn]
        j_start, j_end = self._rendered_index(call.output_start), self._rendered_index(call.output_end)
        ours = _json_objects(self.r.decode(call.output_ids))
        theirs = _json_objects(self.r.decode(self.rendered[j_start:j_end]))
        return bool(ours) and ours == theirs

    def stream_index(self, j: int, j_end: int) -> int | None:
        """The stream position one equal block pairs with render span ``[j, j_end)`` (None where it diverges)."""
        for tag, i1, _i2, j1, j2 in self._opcodes_from(1, j_end):
            if tag == "equal" and j1 <= j and j_end <= j2:
                return i1 + (j - j1)
            if self._ordered_ops and j1 > j:
                break  # every later block starts later in the render
        return None

    def _rendered_index(self, i: int) -> int:
        for tag, i1, i2, j1, j2 in self._opcodes_from(0, i):
            if i1 <= i < i2 or (i == i2 and tag != "equal"):
                return j1 + (i - i1) if tag == "equal" else (j1 if i == i1 else j2)
            if self._ordered_ops and i1 > i:
                break  # every later block starts later in the stream
        return len(self.rendered)

    def _opcodes_from(self, side: int, at: int) -> Iterator[Opcode]:
        """The opcodes from the first whose span on ``side`` (0: stream, 1: render) ends at ``at`` or later: none
        before it can hold ``at``. All of them where the spans do not run in order."""
        if not self._ordered_ops:
            return iter(self.opcodes)
        # indexed from the bisection, not islice'd: islice steps over every opcode before it (quadratic in turns)
        ops = self.opcodes
        return (ops[k] for k in range(bisect.bisect_left(self._op_ends[side], at), len(ops)))

    @functools.cached_property
    def _op_ends(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The opcodes' stream and render span ends, for bisection."""
        return tuple(op[2] for op in self.opcodes), tuple(op[4] for op in self.opcodes)

    @functools.cached_property
    def _ordered_ops(self) -> bool:
        """The opcodes run in order on both sides (the alignment is segment by segment, in order): a bisection
        finds the first that can hold a position."""
        ops = self.opcodes
        return all(a[1] <= b[1] and a[2] <= b[2] and a[3] <= b[3] and a[4] <= b[4] for a, b in itertools.pairwise(ops))


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

    ctx: _Rules
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
    def of(cls, ctx: _Rules, i1: int, i2: int, j1: int, j2: int, texts: tuple[str, str] | None = None) -> Divergence:
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
            f"the tool result is labelled with its own call's name {d.ds.strip(_NAME_EDGE)!r}; the template labels "
            f"it {d.dr.strip(_NAME_EDGE)!r}, another call of the same turn (it names every result after one call)"
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
    kept = _squash(d.dr)
    if len(d.ds) > len(d.dr) and (not kept or kept in _squash(d.ds)):
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


_MOVED_MIN_CHARS = 24
_END_LOOKBACK = 16  # render tokens read for the END close and trailer
_SHARED_LOOKBACK = 4  # tokens a turn's text may start before its segment: a marker's first tokens
_CONTEXT_END_TOKENS = 8  # tokens of the context after the last turn compared with the render's end
# Turn-end defects a rule names at the end of a sampled turn: the stream lacks the close the template writes, or holds
# a stop twice. (Whatever the template writes after its close is the gap's.) A stop's text in the message
# (stop_text_in_message) stays a defect wherever it is: the message does not describe the sampled tokens.
_TURN_END_DEFECTS = frozenset({Cause.CLOSE_MISSING, Cause.AMBIGUOUS_STOP_DUPLICATED})
# per template (fingerprint): a process checks one template, or a few
_FRAMES: LruCache[str, tuple[frozenset[str], tuple[str, ...], tuple[str, ...]]] = LruCache("message frames", 64)
# Causes that read the same text in other ids: more specific than a call block's name, and kept inside one.
_SAME_TEXT = frozenset({Cause.BPE_REMERGE, Cause.SPECIAL_TOKEN_ESCAPED, Cause.SPECIAL_TOKEN_INJECTED, Cause.EOS_ALIAS})


def _only_blocks(text: str, a: int, b: int, blocks: Sequence[Any]) -> bool:
    """``text[a:b]`` outside the call blocks is whitespace only."""
    inside = [(max(a, blk.start), min(b, blk.end)) for blk in blocks if blk.start < b and a < blk.end]
    at, rest = a, []
    for x, y in sorted(inside):
        rest.append(text[at:x])
        at = max(at, y)
    rest.append(text[at:b])
    return not "".join(rest).strip()


def _escaped_spots(
    rules: _Rules, native: Sequence[int], allowed: Callable[[Cause], bool], deadline: float | None
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


def _trailing_generation_prompt(stream: Sequence[int], gen: Sequence[int], outputs: Sequence[tuple[int, int]]) -> int:
    """Where the stream's trailing generation prompt starts (or a start of one, cut by the response length), after
    the last output; ``len(stream)`` when it ends otherwise."""
    last = outputs[-1][1] if outputs else len(stream)
    for m in range(len(gen), 0, -1):
        cut = len(stream) - m
        if cut >= last and tuple(stream[cut:]) == tuple(gen[:m]):
            return cut
    return len(stream)


def _context_ends_like(context: Sequence[int], rendered: Sequence[int]) -> bool:
    """The stream's context after the last turn ends as the render of the final messages does (its last few tokens):
    what follows it in the stream is a generation prompt, not the rest of a message the response length cut."""
    k = min(len(context), _CONTEXT_END_TOKENS)
    return k > 0 and tuple(rendered[len(rendered) - k :]) == tuple(context[len(context) - k :])


def _assistant_frame(r: ChatRenderer) -> tuple[frozenset[str], tuple[str, ...], tuple[str, ...]]:
    """What the template writes around any assistant message's content (squashed text runs, structure aside), the
    non-whitespace text it writes around reasoning (its tags), and of those the ones after the reasoning (its
    closes): rendered once per template with marker texts."""
    key = r.fingerprint
    if key not in _FRAMES:
        user = {"role": "user", "content": "QXUSER"}
        frame: frozenset[str] = frozenset()
        tags: tuple[str, ...] = ()
        closes: tuple[str, ...] = ()
        answer = {"role": "assistant", "content": "QXANSWER"}
        try:
            head, plain, thought = with_tools_if_needed(
                lambda tools: (
                    r.render_text([user], tools, add_generation_prompt=True),
                    r.render_text([user, answer], tools),
                    r.render_text([user, {**answer, "reasoning_content": "QXTHOUGHT"}], tools),
                )
            )
        except Exception:  # a template that needs more than this to render: no frame, no tags (stricter verdicts)
            head = plain = thought = ""
        if plain.startswith(head) and "QXANSWER" in plain:
            before, _, after = plain[len(head) :].partition("QXANSWER")
            frame = frame_runs(before, after, r.control_pattern)
        if thought.startswith(head) and "QXTHOUGHT" in thought:
            around = thought[len(head) :].replace("QXANSWER", " ").split("QXTHOUGHT")
            tags = tuple(t for t in dict.fromkeys(w for part in around for w in part.split()) if t not in head)
            between = thought[len(head) :].split("QXTHOUGHT", 1)[1].partition("QXANSWER")[0]
            closes = tuple(t for t in dict.fromkeys(between.split()) if t not in head)
        _FRAMES[key] = (frame, tags, closes)
        return frame, tags, closes
    return _FRAMES[key]


# A conversation ending in a message of each role after an assistant turn (marker texts), and the assistant messages
# that may follow it: with text, or with a tool call.
_PROBE_CALL = {"id": "call00001", "type": "function", "function": {"name": "calculator", "arguments": {"x": "1"}}}
_PROMPT_CONTEXTS: dict[str, list[dict[str, Any]]] = {
    "tool": [
        {"role": "user", "content": "QXUSER"},
        {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]},
        {"role": "tool", "content": "QXTOOL", "tool_call_id": "call00001", "name": "calculator"},
    ],
    "user": [
        {"role": "user", "content": "QXUSER"},
        {"role": "assistant", "content": "QXANSWER"},
        {"role": "user", "content": "QXUSERB"},
    ],
}
_FOLLOWERS = {
    False: {"role": "assistant", "content": "QXNEXT"},
    True: {"role": "assistant", "content": "", "tool_calls": [{**_PROBE_CALL, "id": "call00002"}]},
}
# per template, role and whether a call follows: 6 per template
_PROMPT_TAILS: LruCache[tuple[str, str, bool], tuple[int, ...]] = LruCache("prompt tails", 256)


def _prompt_tail(r: ChatRenderer, profile: TemplateProfile, role: str, calls: bool) -> tuple[int, ...]:
    """What the template writes at the end of a prompt ending in a ``role`` message (generation prompt included)
    that it does not write there once an assistant message (with a tool call: ``calls``) follows; rendered once per
    template (empty where it cannot render the marker conversation)."""
    key = (r.fingerprint, role, calls)
    if key not in _PROMPT_TAILS:
        chat = profile.tool_call_shape.conform(_PROMPT_CONTEXTS[role])
        follows = profile.tool_call_shape.conform([*chat, _FOLLOWERS[calls]])
        try:
            prompt, history = with_tools_if_needed(
                lambda tools: (
                    r.render(chat, tools, add_generation_prompt=True, escape=False).ids,
                    r.render(follows, tools, add_generation_prompt=False).ids,
                )
            )
            tail = tuple(prompt[len(os.path.commonprefix([prompt, history])) :])
        except Exception:  # noqa: BLE001 - a template that needs more to render: no tail known (a stricter check)
            tail = ()
        _PROMPT_TAILS[key] = tail
        return tail
    return _PROMPT_TAILS[key]


_NAME_EDGE = " .:=\"'"  # what a template writes around a tool name ("functions.NAME to=")
# Per template fingerprint; a worker checks one template in practice.
_CALL_MARKERS: LruCache[str, tuple[str, str] | None] = LruCache("tool-call markers", 64)


def _call_markers(r: ChatRenderer, profile: TemplateProfile) -> tuple[str, str] | None:
    """The control texts (or, where it has none, the tag-shaped plain texts) the template writes once per tool call,
    around its name and arguments (``tool_call_compare``), read from its rendering of an assistant message with two
    calls; rendered once per template (None where it cannot render two calls in a message or writes no such texts)."""
    if r.fingerprint not in _CALL_MARKERS:
        second = {**_PROBE_CALL, "id": "call00002", "function": {**_PROBE_CALL["function"], "name": "search"}}
        message = {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL, second]}
        user = {"role": "user", "content": "QXUSER"}
        try:
            head, full = with_tools_if_needed(
                lambda tools: (
                    r.render_text([user], tools, add_generation_prompt=True),
                    r.render_text(profile.tool_call_shape.conform([user, message]), tools),
                )
            )
        except Exception:  # noqa: BLE001 - a template that refuses two calls in a message
            full = head = ""
        cut = len(os.path.commonprefix([head, full]))
        # The shared prefix may end inside a marker (a generation prompt's "<think>" against the history's
        # "<tool_call>" share "<t"): the body starts at that marker, else its first call's opener is cut.
        for pattern in (r.control_pattern, MARKER):
            for m in pattern.finditer(full, max(cut - 64, 0)) if pattern is not None else ():
                if m.start() < cut < m.end():
                    cut = m.start()
        body = full[cut:]
        keys = list(_PROBE_CALL["function"]["arguments"])
        names = ["calculator", "search"]
        # Where the tokenizer holds them as plain text (Hermes' <tool_call> on a Llama 3 tokenizer), the markers are the
        # tag-shaped texts the template writes once per call: whitespace next to them merges into their last
        # characters' tokens (">" against ">\n"), and the text verdict alone would read a newline the template puts
        # between two calls as a space inside the content.
        markers = None
        if body:
            markers = call_markers(body, names, r.control_pattern, keys) or call_markers(body, names, MARKER, keys)
        _CALL_MARKERS[r.fingerprint] = markers
    return _CALL_MARKERS[r.fingerprint]


def _unicode_forms_only(normalizer: Any) -> bool:
    """The normalizer is one of NFC, NFD, NFKC, NFKD, or a sequence of them (not an empty one)."""
    if normalizer is None:
        return False
    members = spec_components(json.loads(normalizer.__getstate__()), "normalizers")
    return bool(members) and all(m.get("type") in ("NFC", "NFD", "NFKC", "NFKD") for m in members)


def _squash(text: str) -> str:
    return "".join(text.split())


def _json_objects(text: str) -> Counter[str]:
    """Every top-level JSON object in ``text``, canonicalized (sorted keys, no whitespace)."""
    return Counter(
        json.dumps(value, sort_keys=True, separators=(",", ":"))
        for kind, value in json_and_text(text)
        if kind == "json"
    )
