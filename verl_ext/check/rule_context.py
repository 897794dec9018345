"""Rule context: what the cause rules read besides the divergent span (the stream, the render, their alignment
and the template profile), and the helpers over them."""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from verl_ext.check.align import Opcode
from verl_ext.check.cause_rules import NAME_EDGE, RULES, Divergence
from verl_ext.check.decode_memo import MemoDecode
from verl_ext.check.findings import Cause
from verl_ext.check.locate import Locator
from verl_ext.check.prompt_tails import PromptTails
from verl_ext.check.sampled_text import TurnVerdict, json_and_text
from verl_ext.check.sampled_turn import SampledTurn
from verl_ext.check.segments import Segment, segment_opcodes, segments
from verl_ext.check.span_texts import SpanTexts
from verl_ext.check.tool_call_compare import CallsReading
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_profile import END, TemplateProfile
from verl_ext.core.text_cut import spec_components


class RuleContext(SpanTexts, PromptTails, SampledTurn):
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
        super().__init__(MemoDecode(renderer), stream, rendered)  # type: ignore[arg-type]
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
        self._prefill_tails: dict[int | None, tuple[tuple[int, ...], ...]] = {}
        self._block_counts: dict[tuple[str, bool], tuple[int, int]] = {}  # ``_counts``
        self._calls_equal: dict[int, bool] = {}  # ``_tool_calls_equal``, per turn
        self._turn_starts: dict[int | None, tuple[int, int]] = {}  # ``turn_spans``

    def cut_inside(self, i1: int, j1: int) -> bool:
        """The stream ends at ``i1``'s divergence with a prefix of what the render holds from ``j1`` on: the trainer's
        response length cut the rollout there (nothing after the cut is trained)."""
        ours = self.r.decode(self.stream[i1:])
        return bool(ours) and self.r.decode(self.rendered[j1:]).startswith(ours)

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
        a, b = ds.strip(NAME_EDGE), dr.strip(NAME_EDGE)
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


_MOVED_MIN_CHARS = 24
_END_LOOKBACK = 16  # render tokens read for the END close and trailer
_CONTEXT_END_TOKENS = 8  # tokens of the context after the last turn compared with the render's end


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


def _unicode_forms_only(normalizer: Any) -> bool:
    """The normalizer is one of NFC, NFD, NFKC, NFKD, or a sequence of them (not an empty one)."""
    if normalizer is None:
        return False
    members = spec_components(json.loads(normalizer.__getstate__()), "normalizers")
    return bool(members) and all(m.get("type") in ("NFC", "NFD", "NFKC", "NFKD") for m in members)


def _json_objects(text: str) -> Counter[str]:
    """Every top-level JSON object in ``text``, canonicalized (sorted keys, no whitespace)."""
    return Counter(
        json.dumps(value, sort_keys=True, separators=(",", ":"))
        for kind, value in json_and_text(text)
        if kind == "json"
    )
