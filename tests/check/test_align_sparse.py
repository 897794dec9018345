"""The sparse-edit path of the alignment (``_sparse_blocks``): a long middle of a few small edits between long equal
runs. It must give the opcodes the general path (banded edit distance, difflib on each region) gives, and it must
really be taken, or these tests prove nothing."""

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
