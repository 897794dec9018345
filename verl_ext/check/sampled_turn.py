"""Sampled turn: a divergence inside a turn the engine sampled, and whether its message holds what was sampled."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from typing import Any

from verl_ext.check.call_spacing import (
    cuts_a_marker,
    differing_whitespace,
    form_markers,
    spacing_place,
    whitespace_only,
    with_plain_tags,
)
from verl_ext.check.cause_rules import Divergence, squash
from verl_ext.check.findings import ALLOWED_BY_DESIGN, Cause
from verl_ext.check.message_shape import SLOT, message_shape
from verl_ext.check.sampled_text import TurnVerdict, message_holds_sampled
from verl_ext.check.segments import Segment
from verl_ext.check.template_marks import assistant_frame, template_call_markers
from verl_ext.check.tool_call_compare import CallsReading, read_calls, without_blocks, without_python_calls
from verl_ext.core.call_reader import learn_call_reader, parameter_types
from verl_ext.core.errors import TemplateError
from verl_ext.core.template_profile import END


class SampledTurn:
    """The cause of a divergence inside a sampled turn and the turn's verdict: whether its message holds what the
    engine sampled (calls by meaning, the rest by text), and the close verl_ext wrote after it. Mixed into
    ``RuleContext``, whose stream, render, locator and memos it reads."""

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
        if squash(d.ds) == squash(d.dr):
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
            markers = template_call_markers(self.r, self.profile)
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
        if cause in _SAME_TEXT or cause in _REASONING or (cause in _TURN_END_DEFECTS and d.at_end):
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

    def call_block_at(self, part: Segment, i1: int, i2: int, j1: int, j2: int) -> tuple[int, int] | None:
        """The (sampled, rendered) call blocks that hold the divergence ``stream[i1:i2]`` against ``rendered[j1:j2]``
        whole, each side inside one closed block of a call the message holds, on a turn whose message holds its
        calls (``verdict``); None otherwise. Two divergences in the same blocks are one re-serialized call."""
        reading = self.call_reading(part)
        if reading is None or not self.verdict(part).holds:
            return None
        (_, t1, _), (_, u1, _) = self.turn_spans(part)
        if i1 < t1 or j1 < u1:
            return None  # the generation prompt's pre-fill: the prompt's, not a call's
        a, b = (self.prefix(True, t1, i)[0] for i in (i1, i2))
        ra, rb = (self.prefix(False, u1, j)[0] for j in (j1, j2))
        ours = _holding(reading.sampled, a, b, held=True)
        theirs = _holding(reading.rendered, ra, rb, held=False)
        return None if ours is None or theirs is None else (ours, theirs)

    @functools.cached_property
    def _parameter_types(self) -> dict[str, dict[str, str]]:
        """Parameter types per tool (the reader keeps a declared string parameter a string), read once per rollout."""
        return parameter_types(self.tools or ())

    @functools.cached_property
    def _frame(self) -> frozenset[str]:
        return assistant_frame(self.r)[0]

    @functools.cached_property
    def _structure(self) -> re.Pattern[str] | None:
        """Control-token text, and the template's reasoning tags and call markers where they are plain text."""
        markers = (*(template_call_markers(self.r, self.profile) or ()), *form_markers(self.r, self.profile))
        return with_plain_tags(self.r.control_pattern, (*self._reasoning_tags, *markers))

    @functools.cached_property
    def _reasoning_tags(self) -> tuple[str, ...]:
        return assistant_frame(self.r)[1]

    @functools.cached_property
    def _reasoning_closes(self) -> tuple[str, ...]:
        return assistant_frame(self.r)[2]


_SHARED_LOOKBACK = 4  # tokens a turn's text may start before its segment: a marker's first tokens
# Turn-end defects a rule names at the end of a sampled turn: the stream lacks the close the template writes, or holds
# a stop twice. (Whatever the template writes after its close is the gap's.) A stop's text in the message
# (stop_text_in_message) stays a defect wherever it is: the message does not describe the sampled tokens.
_TURN_END_DEFECTS = frozenset({Cause.CLOSE_MISSING, Cause.AMBIGUOUS_STOP_DUPLICATED})
# Causes that read the same text in other ids: more specific than a call block's name, and kept inside one.
_SAME_TEXT = frozenset({Cause.BPE_REMERGE, Cause.SPECIAL_TOKEN_ESCAPED, Cause.SPECIAL_TOKEN_INJECTED, Cause.EOS_ALIAS})
# A reasoning block the template drops or inserts: the divergence holds the block's own tags, text outside every
# call block, so no call block explains it (and the turn's calls need not be read for it: in a rollout whose every
# turn thinks, that read was a third of the check).
_REASONING = frozenset({Cause.REASONING_STRIPPED, Cause.REASONING_INSERTED})


def _holding(blocks: Sequence[Any], a: int, b: int, *, held: bool) -> int | None:
    """The index of the closed block that holds ``[a, b)`` whole, strictly inside its edges (its lead and trail are
    not part of the divergence), and, where ``held``, holds one of the message's calls; None where none does."""
    for k, blk in enumerate(blocks):
        if blk.start < a and b < blk.end and blk.closed and (blk.call is not None or not held):
            return k
    return None


def _only_blocks(text: str, a: int, b: int, blocks: Sequence[Any]) -> bool:
    """``text[a:b]`` outside the call blocks is whitespace only."""
    inside = [(max(a, blk.start), min(b, blk.end)) for blk in blocks if blk.start < b and a < blk.end]
    at, rest = a, []
    for x, y in sorted(inside):
        rest.append(text[at:x])
        at = max(at, y)
    rest.append(text[at:b])
    return not "".join(rest).strip()
