"""The template view's alignment anchored on the rollout's own structure: what verl_ext did not sample, found in
the render, cuts both sides into segments that are aligned one by one.

The training stream is a partition: the first prompt, then per engine call its sampled output and the gap after
it (boundary repairs, a synthetic close, the appended context, the next generation prompt). Every gap is tokens the
template itself rendered, so it is found verbatim in a re-render of the final messages (or, near a sampled output
whose text merges with it, all but a few edge tokens are). Between two gaps the render holds what the template
writes for one assistant message. Aligning each gap with its match and each sampled output with the render between
two matches means a divergence inside one turn (whitespace the template strips, thinking it reformats) can never
shift the comparison of the turns around it. A gap the render does not hold verbatim (a dropped or altered context
message: a real defect) is placed by a whole-rollout alignment instead, and diverges inside its own segment.

The render's end-of-turn token after a turn whose output ended on one is the sampled turn's (``turn_end_ids``):
whatever the template writes after it (Qwen's "\\n") belongs to the gap, so a missing boundary repair is a
divergence of the gap, never text of the message.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from verl_ext.check.align import Opcode, align

EDGE_TRIM = 2  # tokens of a gap next to a sampled output that may merge with it in the render
_MIN_CORE = 4  # tokens a trimmed gap keeps at least
_PROMPT_TAILS = 32  # control tokens of the prompt tried as the start of its tail
_MIDDLE_MIN = 64  # ids of a gap's middle (what every trim keeps) from which its places replace a search per trim
_MIDDLE_PLACES = 8  # places of a middle listed; past them each trim is searched
_SLACK = 512  # render tokens a gap may lie further than twice the sampled body before it (a template's own text)


@dataclass(frozen=True)
class Segment:
    """One piece of the partition: ``stream[i1:i2]`` against ``rendered[j1:j2]``. ``turn`` is the engine call of a
    sampled segment (-1 for a gap); ``anchored`` says whether a gap was found verbatim (False: placed by the
    whole-rollout alignment)."""

    i1: int
    i2: int
    j1: int
    j2: int
    turn: int = -1
    anchored: bool = True

    @property
    def sampled(self) -> bool:
        return self.turn >= 0


def segments(
    stream: Sequence[int],
    rendered: Sequence[int],
    outputs: Sequence[tuple[int, int]],
    turn_end_ids: Collection[int],
    end_tail: int = 0,
    deadline: float | None = None,
    prefill: int = 0,
    control_ids: Collection[int] = (),
    messages_after_last_turn: bool = False,
) -> list[Segment]:
    """The stream/render partition: gap, sampled, gap, ..., gap (``outputs``: each call's ``(start, end)`` in the
    stream, in order). Gaps are matched in the render in order; a gap not found verbatim is placed through the
    whole-rollout alignment. The last gap (what follows the last output) is the render's last ``end_tail`` tokens:
    the close and trailer the template writes after the last message. ``prefill``: how many tokens of the generation
    prompt the template may not re-render once a turn is history (a pre-filled empty think block). ``control_ids``:
    where the prompt is not in the render whole (a block the template writes elsewhere once more messages follow,
    Mistral's tool list), its end is found from the last control tokens on. ``messages_after_last_turn``: the final
    messages go on after the last engine call's message (the trainer's response length cut them off the stream), so
    the last turn's body ends at the render's first end-of-turn token after it, not at the END close."""
    finder = _Finder(rendered)
    gaps = [(0, outputs[0][0] if outputs else len(stream))]
    gaps += [(e, outputs[k + 1][0] if k + 1 < len(outputs) else len(stream)) for k, (_s, e) in enumerate(outputs)]
    placed: list[tuple[int, int, int, int, bool]] = []  # (i1, i2, j1, j2, anchored) per gap
    cursor = 0
    for g, (g1, g2) in enumerate(gaps):
        lead = EDGE_TRIM if g > 0 else 0
        trail = EDGE_TRIM + prefill if g < len(gaps) - 1 else 0
        if g == len(gaps) - 1 and g > 0 and g1 == g2:
            # Nothing after the last output: the render's rest is the END close and trailer after the last message,
            # or, where messages went on past the cut, the last turn's close and all that follows it.
            tail = max(len(rendered) - end_tail, cursor)
            if messages_after_last_turn:
                tail = next((j for j in range(cursor, len(rendered)) if rendered[j] in turn_end_ids), tail)
            placed.append((g1, g2, tail, len(rendered), True))
            break
        # A gap lies after one assistant body, which the template writes in about as many tokens as were sampled.
        body = outputs[g - 1][1] - outputs[g - 1][0] if g > 0 else 0
        window = cursor + 2 * body + (g2 - g1) + _SLACK
        found = _find_gap(stream, finder, g1, g2, lead, trail, cursor, window, control_ids, prefill)
        if found is None and g == 0:
            found = _find_prompt_end(stream, finder, g2, trail, control_ids, window)
        if found is None:
            # A gap the render does not hold (a moved tool list, an altered message): every boundary is placed by
            # one whole-rollout alignment instead, and each segment is aligned inside what it pairs with.
            return _segments_by_alignment(align(stream, rendered, deadline), gaps, outputs, len(rendered))
        if 0 < g < len(gaps) - 1 and any(stream[p] not in turn_end_ids for p in range(*outputs[g])):
            # (after an output of stops alone the next gap comes at once, and a repeat of this one is that gap)
            found = _with_repeats(stream, rendered, found)
        placed.append(found)
        cursor = found[3]
    placed[0] = (0, placed[0][1], 0, placed[0][3], placed[0][4])  # the render's start is the prompt's
    last = placed[-1]
    placed[-1] = (last[0], len(stream), last[2], len(rendered), last[4])
    _give_closes_to_turns(stream, rendered, outputs, placed, turn_end_ids)
    out: list[Segment] = []
    for g, (i1, i2, j1, j2, anchored) in enumerate(placed):
        out.append(Segment(i1, i2, j1, j2, -1, anchored))
        if g < len(outputs):
            n1, _n2, m1, _m2, _a = placed[g + 1]
            out.append(Segment(i2, n1, j2, m1, g))
    return out


def segment_opcodes(
    stream: Sequence[int], rendered: Sequence[int], parts: Sequence[Segment], deadline: float | None = None
) -> tuple[list[Opcode], list[int]]:
    """One alignment of the whole rollout made of each segment's own (divergent blocks never cross a segment), and
    for each opcode the index in ``parts`` of its segment (-1 for an ``equal`` block, which may span several)."""
    ops: list[Opcode] = []
    owners: list[int] = []
    for k, s in enumerate(parts):
        if s.i1 == s.i2 and s.j1 == s.j2:
            continue
        for tag, a1, a2, b1, b2 in align(stream[s.i1 : s.i2], rendered[s.j1 : s.j2], deadline):
            op = (tag, a1 + s.i1, a2 + s.i1, b1 + s.j1, b2 + s.j1)
            if tag == "equal" and ops and ops[-1][0] == "equal" and ops[-1][2] == op[1] and ops[-1][4] == op[3]:
                ops[-1] = ("equal", ops[-1][1], op[2], ops[-1][3], op[4])  # segments meet inside equal runs
                continue
            ops.append(op)
            owners.append(-1 if tag == "equal" else k)
    return ops, owners


def _find_gap(
    stream: Sequence[int],
    finder: _Finder,
    g1: int,
    g2: int,
    lead: int,
    trail: int,
    cursor: int,
    window: int,
    control_ids: Collection[int] = (),
    prefill: int = 0,
) -> tuple[int, int, int, int, bool] | None:
    """The gap ``stream[g1:g2]`` found in the render at or after ``cursor``: whole, else without up to ``lead`` /
    ``trail`` edge tokens (those merge with the sampled text next to them; they stay with the sampled segment).
    An empty gap is found where the cursor is. The match must end before ``window``. A gap cut only at its end, by at
    most ``prefill`` tokens of the generation prompt it ends with, may be short: a pre-fill the template does not
    re-render for history (DeepSeek-R1's ``<think>\n``) leaves little of a short context message around it."""
    if g1 == g2:
        return (g1, g2, cursor, cursor, True)
    best: tuple[int, int, int, int, bool] | None = None
    # Read once, not per trim: a gap is a whole tool result (thousands of ids), tried at up to 18 trims.
    controls = _controls_near_edges(stream, g1, g2, lead, trail, control_ids)
    packed = _Finder.pack(stream[g1:g2])
    a_most, b_most = min(lead, g2 - g1 - 1), min(trail, g2 - g1 - 1)
    inner = packed[4 * a_most : len(packed) - 4 * b_most]  # what every trim keeps
    whole = finder.find_packed(packed, cursor, window)
    first_inner = finder.find_packed(inner, cursor, window) if inner else None
    if whole is not None and inner and first_inner == whole + a_most:
        # No trim lies earlier: each holds the inner ids, first found inside the whole gap's place.
        return (g1, g2, whole, whole + g2 - g1, True)
    middle = _Middle.of(finder, inner, first_inner, window)
    if middle is not None and not middle.places:
        return None  # every trim of the gap holds its middle: one search rules out all of them
    if whole is not None:
        best = (g1, g2, whole, whole + g2 - g1, True)  # the untrimmed gap, searched above
    for a in range(0, a_most + 1):
        for b in range(0, min(trail, g2 - g1 - a - 1) + 1):
            if not a and not b:
                continue  # the whole gap: ``best`` holds its place
            size = g2 - g1 - a - b
            keeps_structure = not controls or any(g1 + a <= p < g2 - b for p in controls)
            if (a or b) and not keeps_structure:
                continue  # text alone (a call id the message renders too) is no anchor: a trimmed gap keeps structure
            prefill_cut = not a and b <= prefill and bool(controls)
            if (a or b) and size < max(_MIN_CORE, (g2 - g1 + 1) // 2) and not prefill_cut:
                continue  # a short core matches anywhere: trimmed, a gap keeps at least half of itself
            core = packed[4 * a : len(packed) - 4 * b]
            limit = window if best is None else min(window, best[2] + a + size)
            if middle is None:
                at = finder.find_packed(core, cursor, limit)
            else:
                at = middle.find(core, a_most - a, cursor, limit)
            # The earliest place wins (a gap repeated later, e.g. a final turn that renders the pre-fill, is not it);
            # at one place, the least trimmed.
            if at is not None and (best is None or at - a < best[2] - (best[0] - g1)):
                best = (g1 + a, g2 - b, at, at + size, True)
    return best


def _controls_near_edges(
    stream: Sequence[int], g1: int, g2: int, lead: int, trail: int, control_ids: Collection[int]
) -> list[int]:
    """Positions of control ids in ``stream[g1:g2]`` as far as trimming ``lead`` / ``trail`` edge tokens can tell them
    apart: those in the edges, and one middle position standing for any number there (a trim never removes it)."""
    head, tail = min(g1 + lead, g2), max(g2 - trail, g1)
    edges = [p for p in (*range(g1, head), *range(max(tail, head), g2)) if stream[p] in control_ids]
    ids = control_ids if isinstance(control_ids, (set, frozenset)) else frozenset(control_ids)
    middle = [head] if head < tail and not ids.isdisjoint(stream[head:tail]) else []
    return sorted(edges + middle)


def _with_repeats(
    stream: Sequence[int], rendered: Sequence[int], found: tuple[int, int, int, int, bool]
) -> tuple[int, int, int, int, bool]:
    """The gap's place in the render extended over copies of it that follow at once where the stream goes on with
    other tokens: context the render holds again and the stream lacks (a tool result the loop's messages hold twice)
    is the gap's, not the next turn's, where a template writes no generation prompt to end the gap."""
    i1, i2, j1, j2, anchored = found
    core = list(rendered[j1:j2])
    if not core or list(stream[i2 : i2 + len(core)]) == core:
        return found
    while list(rendered[j2 : j2 + len(core)]) == core:
        j2 += len(core)
    return (i1, i2, j1, j2, anchored)


def _find_prompt_end(
    stream: Sequence[int],
    finder: _Finder,
    g2: int,
    trail: int,
    control_ids: Collection[int],
    window: int,
) -> tuple[int, int, int, int, bool] | None:
    """The prompt ``stream[0:g2]`` placed in the render by its end: the longest tail that starts at a control token
    and is found verbatim (the render's start is the prompt's; what lies between is aligned inside the segment)."""
    starts = [p for p in range(g2) if stream[p] in control_ids][-_PROMPT_TAILS:]
    for b in range(0, min(trail, g2 - 1) + 1):
        for p in starts:
            if p >= g2 - b:
                break
            at = finder.find(stream[p : g2 - b], 0, window)
            if at is not None:
                return (0, g2 - b, 0, at + (g2 - b - p), True)
    return None


def _segments_by_alignment(
    ops: Sequence[Opcode], gaps: Sequence[tuple[int, int]], outputs: Sequence[tuple[int, int]], rendered_len: int
) -> list[Segment]:
    """The partition with every boundary placed where a whole-rollout alignment pairs it."""
    cuts = sorted({b for s, e in outputs for b in (s, e)})
    where = _map_starts(ops, cuts, rendered_len)
    out: list[Segment] = []
    previous = 0
    for g, (g1, g2) in enumerate(gaps):
        j1 = 0 if g == 0 else where[g1]
        j2 = rendered_len if g == len(gaps) - 1 else max(where[g2], j1)
        j1 = max(j1, previous)
        out.append(Segment(g1, g2, j1, max(j2, j1), -1, False))
        if g < len(outputs):
            s, e = outputs[g]
            end = max(where[e], max(j2, j1))
            out.append(Segment(s, e, max(j2, j1), end, g, False))
            previous = end
    return out


def _give_closes_to_turns(
    stream: Sequence[int],
    rendered: Sequence[int],
    outputs: Sequence[tuple[int, int]],
    placed: list[tuple[int, int, int, int, bool]],
    turn_end_ids: Collection[int],
) -> None:
    """Where a turn's output ended on an end-of-turn token, the render's body for it ends right after the render's
    own end-of-turn token: a close matched as the start of the next gap moves to the turn, and whatever the render
    holds after the turn's last end-of-turn token moves to the gap (so a missing trailer is the gap's)."""
    for k, (s, e) in enumerate(outputs):
        if e <= s or stream[e - 1] not in turn_end_ids:
            continue
        i1, i2, j1, j2, anchored = placed[k + 1]
        body_start = placed[k][3]
        if anchored and j1 < j2 and rendered[j1] in turn_end_ids:
            # The gap's match begins with the render's close: it is the sampled one's (a doubled close stays a gap's).
            placed[k + 1] = (i1, i2, j1 + 1, j2, anchored)
            continue
        last_end = next((j for j in range(j1 - 1, body_start - 1, -1) if rendered[j] in turn_end_ids), None)
        if last_end is not None and last_end + 1 < j1:
            placed[k + 1] = (i1, i2, last_end + 1, j2, anchored)


def _map_starts(ops: Sequence[Opcode], cuts: Sequence[int], rendered_len: int) -> dict[int, int]:
    """``_map_position(..., start=True)`` of every cut: from a bisection each where the opcodes run in order (as
    ``align`` gives them), not a scan of every opcode per cut (a whole-rollout alignment of 1,000 turns, 2,002 cuts)."""
    if not all(x[1] <= y[1] and x[2] <= y[2] for x, y in itertools.pairwise(ops)):
        return {b: _map_position(ops, b, rendered_len, start=True) for b in cuts}
    ends = [op[2] for op in ops]
    return {b: _map_position(ops, b, rendered_len, True, bisect.bisect_left(ends, b), ordered=True) for b in cuts}


def _map_position(
    ops: Sequence[Opcode], i: int, rendered_len: int, start: bool, first: int = 0, ordered: bool = False
) -> int:
    """Where the alignment pairs stream position ``i`` in the render. ``first``: the opcodes before it end before
    ``i`` (none of them can hold it); ``ordered``: they run in order, so none after one starting past ``i`` can."""
    for k in range(first, len(ops)):  # indexed, not islice'd: islice steps over the ``first`` opcodes before
        tag, a1, a2, b1, b2 = ops[k]
        if ordered and a1 > i:
            break
        if a1 <= i < a2 or (i == a2 and not start):
            if tag == "equal":
                return b1 + (i - a1)
            return b1 if start else b2
        if i == a1 == a2 and tag == "insert":
            return b1 if start else b2
    return rendered_len


@dataclass(frozen=True)
class _Middle:
    """The places in the render of a gap's middle (the ids every trim of the gap keeps): a trim can only lie where the
    middle does, at a known offset, so one comparison per place replaces a search of the window per trim (a gap is a
    whole tool result, thousands of ids, tried at up to 18 trims)."""

    finder: _Finder
    places: list[int]
    complete: bool  # every place before the window is listed

    @classmethod
    def of(cls, finder: _Finder, middle: bytes, first: int | None, end: int) -> _Middle | None:
        """The middle's places before ``end``, from ``first``, the first one (None: there is none); None for a middle
        too short to be worth it."""
        if len(middle) < 4 * _MIDDLE_MIN:
            return None
        places: list[int] = []
        at = first
        while at is not None and len(places) < _MIDDLE_PLACES:
            places.append(at)
            at = finder.find_packed(middle, at + 1, end)
        return cls(finder, places, at is None)

    def find(self, core: bytes, offset: int, start: int, end: int) -> int | None:
        """``finder.find_packed(core, start, end)`` for a core that holds the middle ``offset`` ids from its start."""
        for place in self.places:
            at = place - offset
            if 4 * at + len(core) > 4 * end:
                return None  # places are in order: every later one ends past ``end`` too
            if at >= start and self.finder.raw[4 * at : 4 * at + len(core)] == core:
                return at
        return None if self.complete else self.finder.find_packed(core, start, end)


class _Finder:
    """Exact search for a run of ids in the render, as a byte search over the ids packed 4 bytes each."""

    def __init__(self, rendered: Sequence[int]) -> None:
        self.raw = array("I", rendered).tobytes()

    @staticmethod
    def pack(ids: Sequence[int]) -> bytes:
        return array("I", ids).tobytes()

    def find(self, needle: Sequence[int], start: int, end: int) -> int | None:
        """Where ``needle`` first occurs in ``rendered[start:end]``, or None."""
        return self.find_packed(self.pack(needle), start, end)

    def find_packed(self, pattern: bytes, start: int, end: int) -> int | None:
        """``find`` for a needle already packed (``pack``)."""
        if not pattern:
            return start
        at = self.raw.find(pattern, start * 4, end * 4)
        while at != -1 and at % 4:
            at = self.raw.find(pattern, at + 1, end * 4)
        return None if at == -1 else at // 4
