"""The sparse-edit path of the alignment (``_sparse_blocks``): a long middle of a few small edits between long equal
runs. Where only one alignment exists it must give the general path's opcodes (banded edit distance, difflib on each
region); where a repeated token meets an edit several alignments cost the same, and it must never edit more tokens
or report more divergences than the general path. It must really be taken, or these tests prove nothing."""

from __future__ import annotations

import random

import pytest

from verl_ext.check import align as A


def sparse_pair(seed: int, n: int = 12_000, edits: int = 8) -> tuple[list[int], list[int]]:
    """A long random sequence and a copy with ``edits`` small edits (insert, delete, replace of 1-3 tokens)."""
    rng = random.Random(seed)
    a = [rng.randrange(50_000) for _ in range(n)]
    b = list(a)
    spread = [n * (e + 1) // (edits + 1) + rng.randrange(-50, 50) for e in range(edits)]  # far apart: a long middle
    for k in sorted(spread, reverse=True):
        kind = rng.choice(("insert", "delete", "replace"))
        size = rng.randint(1, 3)
        if kind == "insert":
            b[k:k] = [rng.randrange(50_000) for _ in range(size)]
        elif kind == "delete":
            del b[k : k + size]
        else:
            b[k : k + size] = [rng.randrange(50_000) for _ in range(rng.randint(1, 3))]
    return a, b


@pytest.mark.parametrize("seed", range(12))
def test_sparse_edits_give_the_general_paths_opcodes(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = sparse_pair(seed, edits=2 + seed % 8)
    taken = []
    real = A._sparse_blocks
    monkeypatch.setattr(A, "_sparse_blocks", lambda x, y: taken.append(real(x, y)) or taken[-1])
    fast = A.align(a, b)
    assert taken and taken[-1] is not None  # the long middle went the sparse path
    monkeypatch.setattr(A, "_sparse_blocks", lambda x, y: None)
    assert fast == A.align(a, b)


def test_repeating_text_is_left_to_the_general_path() -> None:
    """A period shorter than the window offsets puts equal windows on several diagonals: no sparse blocks."""
    a = [1, 2, 3] * 3000
    b = [9] + [1, 2, 3] * 2999
    assert A._sparse_blocks(a, b) is None


def test_an_edit_larger_than_the_edge_is_left_to_the_general_path() -> None:
    a, b = sparse_pair(0, edits=0)
    b[0] = 100_000  # the middle starts with an edit, as align hands it over
    assert A._sparse_blocks(a, b) is not None
    b[6000:6000] = list(range(100_001, 100_001 + A.EDGE_TOKENS + 1))
    assert A._sparse_blocks(a, b) is None


def _edited(ops: list[A.Opcode]) -> tuple[int, int]:
    """(tokens on either side outside equal runs, divergent regions)."""
    return sum(i2 - i1 + j2 - j1 for t, i1, i2, j1, j2 in ops if t != "equal"), sum(op[0] != "equal" for op in ops)


def _valid(ops: list[A.Opcode], a: list[int], b: list[int]) -> None:
    i = j = 0
    for tag, i1, i2, j1, j2 in ops:
        assert (i1, j1) == (i, j)  # in order, no overlap, no hole
        if tag == "equal":
            assert a[i1:i2] == b[j1:j2]
        i, j = i2, j2
    assert (i, j) == (len(a), len(b))


def test_a_repeated_token_at_an_edit_never_costs_more_than_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of one token (newlines) next to edits: the sparse path may place an edit elsewhere than the general path
    (equal cost, and often one divergence where the general path reports two), never more edits or divergences.
    40 draws; those with repeats on several diagonals go the general path, and most must not."""
    taken = 0
    for seed in range(40):
        rng = random.Random(seed)
        a: list[int] = []
        for token in (rng.randrange(1000, 2000) for _ in range(5000)):
            a += [token] + [13] * (rng.randint(1, 4) if rng.random() < 0.15 else 0)
        b = list(a)
        for k in sorted(rng.sample(range(10, len(a) - 10), rng.randint(2, 10)), reverse=True):
            kind = rng.choice("idr")
            if kind == "i":
                b[k:k] = [13] * rng.randint(1, 3) if rng.random() < 0.5 else [rng.randrange(1000, 2000)]
            elif kind == "d":
                del b[k : k + rng.randint(1, 3)]
            else:
                b[k] = 13
        if A._sparse_blocks(list(a), list(b)) is None:
            continue
        taken += 1
        fast = A.align(a, b)
        with monkeypatch.context() as m:
            m.setattr(A, "_sparse_blocks", lambda x, y: None)
            slow = A.align(a, b)
        _valid(fast, a, b)
        cost, regions = _edited(fast)
        slow_cost, slow_regions = _edited(slow)
        assert cost <= slow_cost and regions <= slow_regions, f"seed {seed}"
    assert taken >= 20  # the sparse path was really exercised


def test_the_reviewers_case_is_one_deletion() -> None:
    """[182, 1, 13, 13, 13] against [13, 13] between long equal runs: the general path reports two deletions around
    an equal [13, 13]; the sparse path one deletion of three tokens (difflib's answer too)."""
    rng = random.Random(5)
    x = [rng.randrange(1000, 2000) for _ in range(3000)]
    y = [rng.randrange(1000, 2000) for _ in range(3000)]
    a, b = x + [182, 1, 13, 13, 13] + y + [7], x + [13, 13] + y + [8]
    assert A.align(a, b) == [
        ("equal", 0, 3000, 0, 3000),
        ("delete", 3000, 3003, 3000, 3000),
        ("equal", 3003, 6005, 3000, 6002),
        ("replace", 6005, 6006, 6002, 6003),
    ]
