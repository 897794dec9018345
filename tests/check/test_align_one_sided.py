"""The one-sided block step of the alignment (``_one_sided_blocks``): a long middle whose gaps each have tokens on
one side only (thinking the template strips, a turn the loop dropped, the END trailer). It must give the general
path's opcodes, really be taken on such middles, and be refused where a block's place is not the only one (a
repeated anchor, tokens that let the block slide) or where a gap has tokens on both sides (a replacement)."""

from __future__ import annotations

import random

import pytest

from verl_ext.check import align as A


def one_sided_pair(seed: int, n: int = 12_000, vocab: int = 50_000) -> tuple[list[int], list[int]]:
    """A random sequence and a copy with 2-6 blocks of 17-2,000 tokens (one block alone is
    what ``align`` trims its common prefix and suffix to) inserted, or deleted (one kind per pair)."""
    rng = random.Random(seed)
    a = [rng.randrange(vocab) for _ in range(n)]
    b = list(a)
    delete = rng.random() < 0.5
    count = rng.randint(2, 6)
    spread = [n * (e + 1) // (count + 1) + rng.randrange(-50, 50) for e in range(count)]  # a long middle
    for k in sorted(spread, reverse=True):
        size = rng.randint(A.EDGE_TOKENS + 1, 2000)  # longer than the sparse step takes
        if delete:
            del b[k : k + size]
        else:
            b[k:k] = [rng.randrange(vocab) for _ in range(size)]
    return a, b


def general(a: list[int], b: list[int], monkeypatch: pytest.MonkeyPatch) -> list[A.Opcode]:
    with monkeypatch.context() as m:
        m.setattr(A, "_one_sided_blocks", lambda x, y: None)
        return A.align(a, b)


def middle(a: list[int], b: list[int]) -> tuple[list[int], list[int]]:
    """The middle ``align`` hands to its steps: both sides without their common prefix and suffix."""
    lo = A._common_run(a, 0, b, 0)
    hi = A._common_suffix(a, b, min(len(a), len(b)) - lo)
    return a[lo : len(a) - hi], b[lo : len(b) - hi]


@pytest.mark.parametrize("seed", range(24))
@pytest.mark.parametrize("vocab", [1_000, 50_000])
def test_one_sided_blocks_give_the_general_paths_opcodes(seed: int, vocab: int, monkeypatch) -> None:
    a, b = one_sided_pair(seed, vocab=vocab)
    if seed % 2:
        a, b = b, a  # blocks on the stream side (stripped thinking) and on the render side
    taken = []
    real = A._one_sided_blocks
    monkeypatch.setattr(A, "_one_sided_blocks", lambda x, y: taken.append(real(x, y)) or taken[-1])
    fast = A.align(a, b)
    assert taken and taken[-1] is not None  # the step was really taken
    assert fast == general(a, b, monkeypatch)
    edited = sum(i2 - i1 + j2 - j1 for tag, i1, i2, j1, j2 in fast if tag != "equal")
    assert edited == abs(len(a) - len(b))  # every edit on one side: the fewest possible


def test_stripped_blocks_between_equal_runs_are_deletions() -> None:
    rng = random.Random(3)
    x, think, y, think2, z = ([rng.randrange(1000, 2000) for _ in range(k)] for k in (4000, 3000, 4000, 500, 100))
    a, b = x + think + y + think2 + z, x + y + z
    assert A._one_sided_blocks(*middle(a, b)) == [(3000, 0, 4000)]  # the middle: think + y + think2 against y
    assert A._one_sided_blocks(*middle(b, a)) == [(0, 3000, 4000)]
    assert A.align(a, b) == [
        ("equal", 0, 4000, 0, 4000),
        ("delete", 4000, 7000, 4000, 4000),
        ("equal", 7000, 11000, 4000, 8000),
        ("delete", 11000, 11500, 8000, 8000),
        ("equal", 11500, 11600, 8000, 8100),
    ]


def test_a_repeated_anchor_is_left_to_the_general_path() -> None:
    """The shorter side's next tokens occur twice in the longer side: two places for the block, no fast step."""
    rng = random.Random(4)
    x, y = [rng.randrange(1000, 2000) for _ in range(3000)], [rng.randrange(1000, 2000) for _ in range(3000)]
    block = [rng.randrange(1000, 2000) for _ in range(500)]
    holder = block[:200] + y[:8] + block[200:]  # holds the anchor (y's first tokens) again
    z = [rng.randrange(1000, 2000) for _ in range(100)]
    a, b = [*block, *x, *holder, *y, *block, *z], [*x, *y, *z]
    assert A._one_sided_blocks(*middle(a, b)) is None
    # without the repeat, the same shape is taken
    a = [*block, *x, *block, *y, *block, *z]
    assert A._one_sided_blocks(*middle(a, b)) is not None


def test_a_block_that_can_slide_is_left_to_the_general_path() -> None:
    """Repeated tokens at the block's edges (a run of newlines): the block has several places of the same cost."""
    rng = random.Random(5)
    x, y = [rng.randrange(1000, 2000) for _ in range(3000)], [rng.randrange(1000, 2000) for _ in range(3000)]
    block = [rng.randrange(1000, 2000) for _ in range(500)]
    z = [rng.randrange(1000, 2000) for _ in range(100)]
    a, b = [*block, *x, 13, *block, 13, *y, *block, *z], [*x, 13, *y, *z]
    assert A._one_sided_blocks(*middle(a, b)) is None  # [13, *block] or [*block, 13]
    a, b = [*block, *x, 13, *block, *y, *block, *z], [*x, 13, *y, *z]
    assert A._one_sided_blocks(*middle(a, b)) is not None
    # A last block after a run of its token (align's middle never ends so: it trims the common suffix first).
    assert A._one_sided_blocks([*block, *x, 13, 13], [*x, 13]) is None
    assert A._one_sided_blocks([*block, *x, 13, 14], [*x, 13]) is not None


def test_repeated_tokens_are_left_to_the_general_path() -> None:
    a = [1, 2, 3] * 3000
    b = [9] + [1, 2, 3] * 2000
    assert A._one_sided_blocks(a, b) is None


def test_blocks_on_both_sides_each_one_sided_are_taken(monkeypatch) -> None:
    rng = random.Random(6)
    a = [rng.randrange(1000, 2000) for _ in range(9000)]
    b = a[:3000] + [rng.randrange(3000, 4000) for _ in range(200)] + a[3000:6000] + a[6300:]  # insert, then delete
    assert A._one_sided_blocks(*middle(a, b)) == [(0, 200, 3000)]
    assert (
        A.align(a, b)
        == general(a, b, monkeypatch)
        == [
            ("equal", 0, 3000, 0, 3000),
            ("insert", 3000, 3000, 3000, 3200),
            ("equal", 3000, 6000, 3200, 6200),
            ("delete", 6000, 6300, 6200, 6200),
            ("equal", 6300, 9000, 6200, 8900),
        ]
    )


def test_a_replacement_is_left_to_the_general_path() -> None:
    rng = random.Random(6)
    a = [rng.randrange(1000, 2000) for _ in range(9000)]
    c = a[:3000] + [5] + a[3001:6000] + a[6300:]  # a replacement, then a deletion
    assert A._one_sided_blocks(*middle(a, c)) is None
    d = a[:3000] + [5] * 40 + a[3030:6000] + a[6300:]  # a longer replacement
    assert A._one_sided_blocks(*middle(a, d)) is None


def test_too_many_blocks_are_left_to_the_general_path() -> None:
    rng = random.Random(8)
    a = [rng.randrange(1000, 2000) for _ in range(40_000)]
    b = [t for k, t in enumerate(a) if k % 500 != 250]  # one token dropped every 500: 80 blocks
    assert A._one_sided_blocks(*middle(a, b)) is None
    assert A._one_sided_blocks(*middle(a[:20_000], b[:19_960])) is not None  # 40 blocks


def test_an_anchor_is_found_only_where_it_occurs_once_on_token_boundaries() -> None:
    from array import array

    def raw(tokens: list[int]) -> bytes:
        return array("q", tokens).tobytes()

    seq = [5, 6, 7, 8, 5, 6, 9]
    assert A._find_once(raw(seq), raw([5, 6]), 0) is None  # twice
    assert A._find_once(raw(seq), raw([5, 6]), 1) == 4  # once from token 1 on
    assert A._find_once(raw(seq), raw([7, 8]), 0) == 2
    # [256, 0] holds the bytes of [1] one byte in: a byte match off a token boundary is no match
    assert A._find_once(raw([256, 0]), raw([1]), 0) is None
    assert A._find_once(raw([256, 0, 1]), raw([1]), 0) == 2


def test_alike_blocks_one_of_them_kept_are_read_by_the_fewest_edits(monkeypatch) -> None:
    """Five identical thinking blocks the template strips and a sixth, the last turn's, it keeps (then the END
    trailer, render-only): each block's start also occurs ahead in the render. The reading with fewer edits in all
    is taken: the five deletions, as the general path has them."""
    rng = random.Random(9)
    think = [rng.randrange(1000, 2000) for _ in range(1500)]
    answers = [[rng.randrange(3000, 4000) for _ in range(23)] for _ in range(6)]
    a: list[int] = [1] * 15
    b: list[int] = [1] * 15
    for answer in answers[:5]:
        a += think + answer
        b += answer
    a += [*think, *answers[5], 7]
    b += [*think, *answers[5], 7, 8]
    taken = []
    real = A._one_sided_blocks
    monkeypatch.setattr(A, "_one_sided_blocks", lambda x, y: taken.append(real(x, y)) or taken[-1])
    ops = A.align(a, b)
    assert taken and taken[-1] is not None
    assert [op[0] for op in ops if op[0] != "equal"] == ["delete"] * 5 + ["insert"]
    assert ops == general(a, b, monkeypatch)
