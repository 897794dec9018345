"""The check's alignment: difflib's opcodes where the old check could run, the same findings on long repetitive
rollouts through the fast path, valid opcodes always, and a time budget that stops it (counted, never raised)."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from long_rollouts import SCENARIOS, difflib_alignment
from rollouts import TOOLS

from verl_ext.check import CheckMode, CheckPolicy, ConsistencyChecker, Enforcer
from verl_ext.check import align as align_module
from verl_ext.check.align import BudgetExceeded, align
from verl_ext.check.record import RecordedCheck
from verl_ext.telemetry.metrics import aggregate

before = difflib_alignment  # the reference: the check's alignment until now


def assert_valid(ops, a, b):
    """Opcodes cover both sides in order, equal runs are equal, and no two edits or two equal runs touch."""
    i = j = 0
    for k, (tag, i1, i2, j1, j2) in enumerate(ops):
        assert (i1, j1) == (i, j) and i1 <= i2 and j1 <= j2 and (i1 < i2 or j1 < j2)
        if tag == "equal":
            assert a[i1:i2] == b[j1:j2]
        else:
            assert (
                tag == {(True, True): "replace", (False, True): "insert", (True, False): "delete"}[(i1 < i2, j1 < j2)]
            )
        if k:
            assert (ops[k - 1][0] == "equal") != (tag == "equal")
        i, j = i2, j2
    assert (i, j) == (len(a), len(b))


tokens = st.lists(st.integers(0, 6), max_size=80)


@settings(max_examples=300, deadline=None)
@given(tokens, tokens)
def test_short_sequences_get_exactly_difflibs_opcodes(a, b):
    assert align(a, b) == before(a, b)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=300), st.data())
def test_the_fast_path_gives_valid_opcodes(a, data):
    """Anchors, banded edit distance and refinement all forced on small inputs: whatever the edits, the opcodes
    describe ``a`` -> ``b``."""
    b = list(a)
    for _ in range(data.draw(st.integers(0, 8))):
        k = data.draw(st.integers(0, len(b)))
        op = data.draw(st.sampled_from(["insert", "delete", "replace"]))
        if op == "insert":
            b[k:k] = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=20))
        elif op == "delete":
            del b[k : k + data.draw(st.integers(1, 20))]
        else:
            b[k : k + 3] = data.draw(st.lists(st.integers(0, 5), max_size=5))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(align_module, "DIRECT_CELLS", 4)
        mp.setattr(align_module, "DIFFLIB_CELLS", 4)
        mp.setattr(align_module, "ANCHOR_EVERY", 1)
        mp.setattr(align_module, "ANCHOR_GRAM", 2)
        assert_valid(align(a, b), a, b)


def test_long_repetitive_sequences_show_exactly_their_edits():
    """200k tokens of one repeated line with a numbered header every 5000 tokens; four local edits far apart come
    back as four opcodes, exactly where they were made."""
    rng = random.Random(7)
    line = [rng.randrange(1000, 2000) for _ in range(25)]
    a: list[int] = []
    while len(a) < 200_000:
        a += [5, 10_000 + len(a), 6] + line * 200
    b = list(a)
    b[150_010:150_012] = [1, 2, 3]  # replace
    del b[100_000:100_040]  # delete
    b[60_000:60_000] = [9] * 30  # insert
    b[7] = 4  # replace, near the start
    ops = align(a, b)
    assert_valid(ops, a, b)
    assert [op for op in ops if op[0] != "equal"] == [
        ("replace", 7, 8, 7, 8),
        ("insert", 60_000, 60_000, 60_000, 60_030),
        ("delete", 100_000, 100_040, 100_030, 100_030),
        ("replace", 150_010, 150_012, 150_000, 150_003),
    ]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_long_rollout_findings_are_the_same_as_through_difflib(scenario, renderer_for, monkeypatch):
    """Repetitive rollouts small enough for the old alignment, checked once through it and once through the fast
    path (anchors and banded edit distance forced on): the same findings, at the same positions on both sides."""
    r = renderer_for("qwen3")
    ro = SCENARIOS[scenario](r, 1500)
    tools = None if scenario == "stripped" else TOOLS

    def findings():
        result = ConsistencyChecker(r).check(ro.calls, ro.sample, ro.messages, tools)
        assert result.template_view and not result.template_view_skipped
        return [(f.cause, f.stream, f.rendered, f.detail) for f in result.findings]

    with monkeypatch.context() as mp:
        mp.setattr(align_module, "DIRECT_CELLS", 1024)
        fast = findings()
    monkeypatch.setattr("verl_ext.check.template_view.align", lambda a, b, deadline=None: before(a, b))
    assert fast == findings() and fast


def test_past_the_budget_the_template_view_is_skipped_and_counted(renderer_for, caplog):
    r = renderer_for("qwen3")
    ro = SCENARIOS["naive"](r, 2000)
    policy = CheckPolicy.from_mapping({"mode": "strict", "template_view_budget_s": 1e-6})
    result = ConsistencyChecker(r, policy=policy).check(ro.calls, ro.sample, ro.messages, TOOLS)
    assert not result.template_view and "over its 1e-06 s budget" in result.template_view_skipped
    assert "raise verl_ext.check.template_view_budget_s" in result.template_view_skipped
    assert (
        result.engine_ok and RecordedCheck.of(result).to_json()["template_view_skipped"] == result.template_view_skipped
    )
    assert aggregate([result, result])["tito/check_skipped"] == 2
    enforcer = Enforcer(policy)
    with caplog.at_level(logging.WARNING, logger="verl_ext.check"):
        for _ in range(3):
            enforcer.enforce(result, step=4)  # strict, yet a skip never raises: nothing was found wrong
    assert [m.getMessage()[:30] for m in caplog.records] == ["step 4: template view skipped,"]
    unlimited = CheckPolicy.from_mapping({"template_view_budget_s": None})
    full = ConsistencyChecker(r, policy=unlimited).check(ro.calls, ro.sample, ro.messages, TOOLS)
    assert full.template_view and not full.template_view_skipped and full.defects


def test_alignment_past_its_deadline_raises_instead_of_running_on():
    a = list(range(300_000))
    b = [x + 1_000_000 for x in a]  # nothing in common: a quadratic alignment without the deadline
    with pytest.raises(BudgetExceeded, match="300000 stream and 300000 template tokens"):
        align(a, b, deadline=__import__("time").perf_counter() + 0.05)


@pytest.mark.parametrize("value", [0, -1.0, "soon", float("inf")])
def test_a_bad_budget_names_the_option(value):
    with pytest.raises(ValueError, match="template_view_budget_s"):
        CheckPolicy.from_mapping({"template_view_budget_s": value})


def test_the_default_budget_is_on():
    assert CheckPolicy().template_view_budget_s == 10.0 and CheckPolicy().mode is CheckMode.WARN
