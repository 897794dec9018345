"""The check explains a finding from its own turn: the engine calls indexed by position answer exactly as
the scans of every call they replace, and a rollout whose every turn draws an allowed finding costs the check the
same reads of the calls per turn at 120 turns as at 30 (counted, not timed)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from long_rollouts import templated_tool_rollout
from rollouts import TOOLS

from verl_ext.check import CheckPolicy, ConsistencyChecker
from verl_ext.check.align import align
from verl_ext.check.call_index import CallIndex
from verl_ext.check.engine_view import turn_at
from verl_ext.check.inputs import EngineCall
from verl_ext.check.locate import Locator
from verl_ext.check.rule_context import RuleContext
from verl_ext.check.segments import _map_position, _map_starts
from verl_ext.core.probe import probe_template


def calls_at(layout: Sequence[tuple[int, int]]) -> list[EngineCall]:
    """Engine calls whose outputs lie at ``(start, length)`` each (prompt and output ids are placeholders)."""
    return [EngineCall.of([7] * start, [8] * length, None) for start, length in layout]


@settings(max_examples=150, derandomize=True, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 6)), max_size=8).flatmap(
        lambda raw: st.sampled_from([sorted(raw), raw])  # in stream order, or as a broken record may hold them
    )
)
def test_the_call_index_answers_as_a_scan_of_every_call(layout):
    calls = calls_at(layout)
    index = CallIndex(calls)
    starts, ends = [c.output_start for c in calls], [c.output_end for c in calls]
    for p in range(-1, 50):
        assert index.turn(p) == turn_at(calls, p)
        assert index.first_starting_at(p) == next((k for k, s in enumerate(starts) if s == p), None)
        assert index.starts_at(p) == (p in starts) and index.ends_at(p) == (p in ends)
        assert list(index.ending_at(p)) == [k for k, e in enumerate(ends) if e == p]
        for q in range(p, p + 9):
            assert index.end_within(p, q) == any(p <= e <= q for e in ends)
            assert index.covers(p, q) == any(s <= p and q <= e for s, e in zip(starts, ends, strict=True))
            assert index.starting_within(p, q) == [k for k, s in enumerate(starts) if p <= s <= q]


def _rendered_index_scan(ops: Sequence[Any], i: int, end: int) -> int:
    for tag, i1, i2, j1, j2 in ops:
        if i1 <= i < i2 or (i == i2 and tag != "equal"):
            return j1 + (i - i1) if tag == "equal" else (j1 if i == i1 else j2)
    return end


def _stream_index_scan(ops: Sequence[Any], j: int, j_end: int) -> int | None:
    return next((i1 + (j - j1) for tag, i1, _i2, j1, j2 in ops if tag == "equal" and j1 <= j and j_end <= j2), None)


def _prefill_dropped_scan(ctx: RuleContext, i1: int, i2: int) -> str | None:
    """The template view's reading before the index: every call, every pre-fill."""
    for turn, c in enumerate(ctx.loc.calls):
        start = c.output_start
        for gen in ctx._prefills(turn):
            if (
                not start - len(gen) <= i1 < start
                or i2 > c.output_end
                or tuple(ctx.stream[start - len(gen) : start]) != gen
            ):
                continue
            head = tuple(ctx.stream[i1:start] if i2 > start else ctx.stream[i1:i2])
            if i2 <= start and any(gen[k : k + len(head)] == head for k in range(len(gen) - len(head) + 1)):
                return "prefill"
            if i2 > start and gen[len(gen) - len(head) :] == head:
                return "prefill and sampled"
    return None


def _known_inside_scan(ctx: RuleContext, span: tuple[bool, int, int]) -> list[tuple[bool, int, int]]:
    in_stream, a, b = span
    inside = [(s, x, y) for s, x, y in ctx._texts if s == in_stream and a <= x < y <= b and (x, y) != (a, b)]
    if not inside or not ctx.r.decode_joins:
        return [span]
    _, x, y = max(inside, key=lambda k: k[2] - k[1])
    return [piece for piece in ((in_stream, a, x), (in_stream, x, y), (in_stream, y, b)) if piece[1] < piece[2]]


def rules_for(renderer: Any, turns: int, **how: Any) -> RuleContext:
    """What the template view's rules read for a templated tool rollout of ``turns`` turns."""
    profile = probe_template(renderer)
    ro = templated_tool_rollout(renderer, profile, turns, **how)()
    stream = ro.sample.stream
    loc = Locator.build(ro.calls, ro.messages, stream, renderer, ro.prompt_messages, ro.assistants)
    shaped = profile.tool_call_shape.conform(ro.messages)
    rendered = renderer.render(shaped, TOOLS, add_generation_prompt=False, escape=False).ids
    return RuleContext(loc, profile, renderer, ro.messages, stream, rendered, None, TOOLS)


HOW = {
    "empty think block": ("qwen3", {}, {"extra": {"reasoning_content": ""}}),
    "thinking off": ("qwen3", {"enable_thinking": False}, {}),
    "think block + compact calls": ("qwen3", {}, {"compact": True}),
    "analysis each turn": ("gpt-oss", {}, {"extra": {"thinking": "Let me see."}, "answer_extra": False}),
    "compact calls": ("mistral-7b-v0.3", {}, {"compact": True}),
}


@pytest.mark.parametrize("name", sorted(HOW))
def test_the_rules_bisections_answer_as_their_scans(renderer_for, name):
    family, kwargs, how = HOW[name]
    ctx = rules_for(renderer_for(family).with_template_kwargs(kwargs), 5, **how)
    ops, calls = ctx.opcodes, ctx.loc.calls
    for i in range(len(ctx.stream) + 1):
        assert ctx._rendered_index(i) == _rendered_index_scan(ops, i, len(ctx.rendered)), i
        assert ctx._at_turn_start(i) == any(c.output_start == i for c in calls)
        assert ctx._at_turn_end(i) == any(c.output_end == i for c in calls)
    for _tag, _i1, _i2, j1, j2 in ops:
        for j, j_end in itertools.combinations(range(j1 - 1, j2 + 2), 2):
            assert ctx.stream_index(j, j_end) == _stream_index_scan(ops, j, j_end), (j, j_end)
    near = sorted({p for c in calls for p in range(c.output_start - 12, c.output_start + 4)})
    for i1, i2 in itertools.combinations(near, 2):
        assert ctx._prefill_dropped(i1, i2) == _prefill_dropped_scan(ctx, i1, i2), (i1, i2)
        assert ctx._all_sampled(i1, i2) == any(c.output_start <= i1 and i2 <= c.output_end for c in calls)
        assert ctx._touches_turn_end(i1, i2) == any(i1 <= c.output_end <= i2 for c in calls)
    # decoded spans: each new one read as the longest decoded inside it, the first decoded of equal ones
    cuts = range(0, len(ctx.stream), max(len(ctx.stream) // 16, 1))
    spans = [(in_stream, a, b) for in_stream in (True, False) for a, b in itertools.combinations(cuts, 2)]
    for step, span in enumerate(spans):
        expected = _known_inside_scan(ctx, span)
        assert ctx._known_inside(span) == expected, span
        if step % 3 == 0:
            ctx.texts([span])


def reads_per_turn(renderer: Any, turns: int, monkeypatch: Any) -> tuple[float, int]:
    """Reads of the engine calls' output positions per turn while the whole check runs, and how often the template
    view worked out a turn's pre-fills."""
    profile = probe_template(renderer)
    rollout = templated_tool_rollout(renderer, profile, turns, extra={"reasoning_content": ""})()
    reads = [0]
    start, end = EngineCall.output_start, EngineCall.output_end

    def counted(prop: property) -> property:
        def read(call: EngineCall) -> int:
            reads[0] += 1
            return prop.fget(call)  # type: ignore[misc]

        return property(read)

    tails = [0]
    worked_out = RuleContext._prompt_tails_before

    def tails_before(self: RuleContext, turn: int | None) -> Any:
        tails[0] += 1
        return worked_out(self, turn)

    checker = ConsistencyChecker(renderer, profile, policy=CheckPolicy(template_view_budget_s=None))
    with monkeypatch.context() as m:
        m.setattr(EngineCall, "output_start", counted(start))
        m.setattr(EngineCall, "output_end", counted(end))
        m.setattr(RuleContext, "_prompt_tails_before", tails_before)
        result = checker.check_rollout(rollout, template_view=True)
    assert result.ok and result.cause_counts()["reasoning_stripped"] == turns, result.cause_counts()
    return reads[0] / turns, tails[0]


def test_explaining_every_turns_finding_reads_the_calls_a_constant_number_of_times_per_turn(renderer_for, monkeypatch):
    """Qwen3, thinking on, each turn's empty think block dropped from history (one allowed finding per turn): the
    reads of the calls' positions grow with the turns, not with turns x findings, and each turn's pre-fills are
    worked out once (they were worked out for every call, per finding: 180,000 times at 300 turns)."""
    r = renderer_for("qwen3")
    few, many = 30, 120
    (per_few, tails_few), (per_many, tails_many) = (reads_per_turn(r, n, monkeypatch) for n in (few, many))
    assert per_many <= 1.25 * per_few, (per_few, per_many)
    assert tails_few <= few + 2 and tails_many <= many + 2, (tails_few, tails_many)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=40), st.lists(st.integers(0, 5), max_size=40))
def test_the_whole_rollout_alignment_places_every_cut_as_its_scan_does(stream, rendered):
    """Where a gap is not in the render (a moved tool list), every turn boundary is placed by one alignment: placed by
    bisection (2,002 cuts at 1,000 turns), each where the scan of every opcode places it; out-of-order opcodes too."""
    ops = align(stream, rendered)
    cuts = list(range(len(stream) + 2))
    for opcodes in (ops, ops[::-1]):
        assert _map_starts(opcodes, cuts, len(rendered)) == {
            b: _map_position(opcodes, b, len(rendered), start=True) for b in cuts
        }
