"""Align two token sequences (the training stream and a re-render) in near-linear time, within a deadline.

The two sides are almost always equal but for a few local divergences, and long rollouts are often repetitive
(the same tool output line thousands of times), where ``difflib`` alone is quadratic or worse. So:

1. the common prefix and suffix are trimmed (the usual case is a long one);
2. a long middle that is a few small edits between long equal runs (a re-merged first turn, a missing newline at
   each boundary, the END trailer) is cut at those runs, found by comparing a few windows after each edit, where
   each edit leaves one diagonal of equal windows (``_sparse_blocks``; where a repeated token meets an edit it
   may place the edit elsewhere than step 3 would, at equal cost, never with more divergences); otherwise
   a long middle is cut at anchors: k-grams found exactly once on each side, the longest chain of them in order
   on both sides, each grown while equal (a thinking block the template drops becomes one small gap);
3. a long gap is aligned by rapidfuzz's Levenshtein in a band that doubles until it holds the edit distance:
   about length × distance / 64 machine words, not length²;
4. each small divergent region is re-aligned by ``difflib`` (as the check always did) or, when too large for
   difflib's worst case, by the longest common subsequence, so as many tokens as possible stay equal.

A middle of at most ``DIFFLIB_CELLS`` (512 × 512 tokens) is step 4 alone: there the opcodes are ``difflib``'s,
exactly. Every native call's cost is predicted from the one before it; when the next would end past the deadline,
``BudgetExceeded`` is raised instead (the caller reports the check as skipped, never hangs). Opcodes read like
``difflib``'s: adjacent edits are one ``replace`` (or ``insert``/``delete``).
"""

from __future__ import annotations

import bisect
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from difflib import SequenceMatcher

from rapidfuzz.distance import Indel, Levenshtein

from verl_ext.core.errors import VerlExtError

Opcode = tuple[str, int, int, int, int]

ANCHOR_GRAM = 8  # tokens per anchor k-gram: long enough to be unique outside repeated text
ANCHOR_EVERY = 4  # anchor k-grams start on token ids divisible by this (a content-defined sample)
DIRECT_CELLS = 1 << 22  # a gap with at most this many cells is aligned in one call (at most milliseconds)
DIFFLIB_CELLS = 1 << 18  # difflib only on regions this small: on repetitive text its cost is about the cell count
EDGE_TOKENS = 16  # a long middle of equal runs this few tokens apart takes no edit distance (``_sparse_blocks``)
SPARSE_MAX_EDITS = 1024
ONE_SIDED_MAX_BLOCKS = 64  # one-sided blocks found by search (each search reads the rest of a side)
ANCHOR_WINDOW = 64  # tokens compared to find that run
_FIRST_BAND = 64  # the first edit-distance bound tried on a long gap (one machine word)


class BudgetExceeded(VerlExtError, RuntimeError):
    """Work would end past its deadline; ``str()`` says what was being done."""


def check_deadline(deadline: float | None, doing: str) -> None:
    """Raise ``BudgetExceeded`` when ``deadline`` (a ``time.perf_counter()`` value) has passed."""
    if deadline is not None and time.perf_counter() > deadline:
        raise BudgetExceeded(f"the time ran out {doing}")


def align(a: Sequence[int], b: Sequence[int], deadline: float | None = None) -> list[Opcode]:
    """``difflib``-style opcodes turning ``a`` into ``b``. ``deadline`` is a ``time.perf_counter()`` value."""
    a, b = list(a), list(b)  # one type on both sides: slices of a tuple and a list never compare equal
    la, lb = len(a), len(b)
    lo = _common_run(a, 0, b, 0)
    hi = _common_suffix(a, b, min(la, lb) - lo)
    ops: list[Opcode] = [("equal", 0, lo, 0, lo)] if lo else []
    ma, mb = a[lo : la - hi], b[lo : lb - hi]
    if ma or mb:
        # Anchors only where the whole middle is long and more than a few edits apart (one cheap banded pass).
        big = len(ma) * len(mb) > DIRECT_CELLS
        cut = (_sparse_blocks(ma, mb) or _one_sided_blocks(ma, mb)) if big else None
        if cut is not None:
            blocks = cut
        else:
            blocks = _anchor_blocks(ma, mb) if big and _edits_exceed(ma, mb, _FIRST_BAND) else []
        check_deadline(deadline, f"finding anchors in {len(ma)} stream and {len(mb)} template tokens")
        i = j = 0
        for bi, bj, n in [*blocks, (len(ma), len(mb), 0)]:
            ops += _shift(_gap(ma[i:bi], mb[j:bj], deadline), lo + i, lo + j)
            if n:
                ops.append(("equal", lo + bi, lo + bi + n, lo + bj, lo + bj + n))
            i, j = bi + n, bj + n
    if hi:
        ops.append(("equal", la - hi, la, lb - hi, lb))
    return _normalized(ops)


def _common_run(a: list[int], i: int, b: list[int], j: int) -> int:
    """How many tokens are equal from ``a[i]`` and ``b[j]`` on; compared in doubling chunks, so a run of 300k
    tokens costs a few C-speed slice comparisons."""
    n = min(len(a) - i, len(b) - j)
    run, step = 0, 64
    while run < n:
        end = min(n, run + step)
        if a[i + run : i + end] != b[j + run : j + end]:
            break
        run, step = end, step * 2
    while run < n and a[i + run] == b[j + run]:
        run += 1
    return run


def _sparse_blocks(a: list[int], b: list[int]) -> list[tuple[int, int, int]] | None:
    """Equal blocks ``(i, j, n)`` that leave at most ``EDGE_TOKENS`` tokens of each side between two of them and at
    each end, or None. The usual long divergent middle is a few small edits (a re-merged first turn, a missing
    newline at each turn boundary, the END trailer) between long equal runs: found here by comparing a few windows
    after each edit, instead of an edit distance over the whole middle. Only where, after each edit, a single
    diagonal holds an equal window (text repeating within a few tokens allows several alignments: the general path
    chooses among them), and for at most ``SPARSE_MAX_EDITS`` edits."""
    w, edge = ANCHOR_WINDOW, EDGE_TOKENS
    blocks: list[tuple[int, int, int]] = []
    i = j = 0
    while len(blocks) < SPARSE_MAX_EDITS:
        # Each side's windows hashed once (a few dozen slices, not every pair compared); equal hashes compared.
        in_b: dict[int, list[int]] = {}
        for y in range(j, min(j + edge, len(b) - w) + 1):
            in_b.setdefault(hash(tuple(b[y : y + w])), []).append(y)
        hits = []
        for x in range(i, min(i + edge, len(a) - w) + 1):
            window = a[x : x + w]
            hits += [(x, y) for y in in_b.get(hash(tuple(window)), ()) if window == b[y : y + w]]
        if not hits or len({x - y for x, y in hits}) != 1:
            return None
        x, y = min(hits)
        n = _common_run(a, x, b, y)
        blocks.append((x, y, n))
        i, j = x + n, y + n
        if len(a) - i <= edge and len(b) - j <= edge:
            return blocks
    return None


def _one_sided_blocks(a: list[int], b: list[int]) -> list[tuple[int, int, int]] | None:
    """Equal blocks ``(i, j, n)`` between which only one side has tokens (a thinking block the template drops, a turn
    the loop dropped, the END trailer), or None. After each equal run, the next ``ANCHOR_GRAM`` tokens of each side
    are searched in the other, where they must occur exactly once (where both do, the reading with fewer edits in
    all, its block plus the length difference it leaves, is taken), and the block skipped must be one that cannot
    slide (the tokens at its two edges differ), so it has one place. A gap with tokens on both sides (a
    replacement), an anchor found twice, or more than ``ONE_SIDED_MAX_BLOCKS`` blocks are left to the general
    path. Each search reads the rest of the other side once, at C speed."""
    raw_a, raw_b = array("q", a).tobytes(), array("q", b).tobytes()
    blocks: list[tuple[int, int, int]] = []
    i = j = 0
    while True:
        n = _common_run(a, i, b, j)
        if n:
            blocks.append((i, j, n))
            i, j = i + n, j + n
        if i == len(a) or j == len(b):  # the rest of the other side is the last block
            seq, k = (b, j) if i == len(a) else (a, i)
            return None if 0 < k < len(seq) and seq[k - 1] == seq[-1] else blocks  # it must not slide left
        if len(blocks) > ONE_SIDED_MAX_BLOCKS:
            return None
        x = _find_once(raw_a, array("q", b[j : j + ANCHOR_GRAM]).tobytes(), i) if len(b) - j >= ANCHOR_GRAM else None
        y = _find_once(raw_b, array("q", a[i : i + ANCHOR_GRAM]).tobytes(), j) if len(a) - i >= ANCHOR_GRAM else None
        if x is not None and y is not None:
            # Both sides' next tokens occur ahead on the other (repeated text: thinking blocks alike, one of them
            # kept). Each reading's fewest edits in all: its block, then at least the length difference it leaves.
            surplus = (len(a) - i) - (len(b) - j)
            drop, add = (x - i) + abs(surplus - (x - i)), (y - j) + abs(surplus + (y - j))
            x, y = (x, None) if drop < add else (None, y) if add < drop else (None, None)
        if x is None and y is None:
            return None  # a replacement
        # The block cannot slide right (the equal run before it is maximal); it must not slide left either.
        if x is not None:
            if i and a[i - 1] == a[x - 1]:
                return None
            i = x
        else:
            assert y is not None
            if j and b[j - 1] == b[y - 1]:
                return None
            j = y


def _find_once(raw: bytes, needle: bytes, start: int) -> int | None:
    """The token position where ``needle`` (whole tokens, 8 bytes each) occurs in ``raw`` at or after token
    ``start``, when it occurs there exactly once."""
    found: list[int] = []
    at = raw.find(needle, 8 * start)
    while at != -1 and len(found) < 2:
        if at % 8 == 0:
            found.append(at // 8)
        at = raw.find(needle, at + 1)
    return found[0] if len(found) == 1 else None


def _common_suffix(a: list[int], b: list[int], limit: int) -> int:
    la, lb = len(a), len(b)
    hi, step = 0, 64
    while hi < limit:
        nxt = min(limit, hi + step)
        if a[la - nxt : la - hi] != b[lb - nxt : lb - hi]:
            break
        hi, step = nxt, step * 2
    while hi < limit and a[la - 1 - hi] == b[lb - 1 - hi]:
        hi += 1
    return hi


def _grams(seq: list[int]) -> dict[int, int]:
    """k-gram hash -> start, for k-grams that occur once in ``seq``. Only k-grams starting on a token id divisible by
    ``ANCHOR_EVERY`` are taken: the rule depends on content only, so equal text yields the same candidates on both
    sides, at a fraction of the cost. Hash collisions are harmless: anchors are compared before use."""
    raw = array("q", seq).tobytes()
    width, last = 8 * ANCHOR_GRAM, len(seq) - ANCHOR_GRAM
    starts = [p for p, token in enumerate(seq) if token % ANCHOR_EVERY == 0 and p <= last]
    hashes = [hash(raw[8 * p : 8 * p + width]) for p in starts]
    counts = Counter(hashes)
    return {h: p for h, p in zip(hashes, starts, strict=True) if counts[h] == 1}


def _anchor_blocks(a: list[int], b: list[int]) -> list[tuple[int, int, int]]:
    """Equal blocks ``(i, j, n)``, increasing on both sides, from k-grams that occur once in ``a`` and once in
    ``b`` (patience diff on k-grams): the longest chain of them in order on both sides, each grown while equal."""
    in_a, in_b = _grams(a), _grams(b)
    pairs = sorted((j, in_a[h]) for h, j in in_b.items() if h in in_a)
    blocks: list[tuple[int, int, int]] = []
    i0 = j0 = 0  # everything before these is already placed
    for i, j in _longest_chain([(i, j) for j, i in pairs]):
        if i < i0 or j < j0 or a[i : i + ANCHOR_GRAM] != b[j : j + ANCHOR_GRAM]:
            continue  # inside the previous block, or a hash collision
        while i > i0 and j > j0 and a[i - 1] == b[j - 1]:
            i, j = i - 1, j - 1
        n = _common_run(a, i, b, j)
        blocks.append((i, j, n))
        i0, j0 = i + n, j + n
    return blocks


def _longest_chain(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest subsequence of ``pairs`` (sorted by j, distinct i) increasing in i: patience sorting."""
    tails: list[int] = []  # i of the last pair of the best chain of each length
    tail_at: list[int] = []  # index into pairs of that pair
    back = [-1] * len(pairs)
    for k, (i, _) in enumerate(pairs):
        length = bisect.bisect_left(tails, i)
        if length == len(tails):
            tails.append(i)
            tail_at.append(k)
        else:
            tails[length] = i
            tail_at[length] = k
        back[k] = tail_at[length - 1] if length else -1
    chain = []
    k = tail_at[-1] if tail_at else -1
    while k != -1:
        chain.append(pairs[k])
        k = back[k]
    return chain[::-1]


def _gap(a: list[int], b: list[int], deadline: float | None) -> list[Opcode]:
    if not a and not b:
        return []
    if not a or not b:
        return [("insert" if not a else "delete", 0, len(a), 0, len(b))]
    _check(deadline, 0.0, len(a), len(b), 0)
    if len(a) * len(b) <= DIRECT_CELLS:
        return _refined(a, b)
    # Find the edit distance in a doubling band: each try costs about twice the last, so the last one measured
    # predicts the next, and the deadline is checked before every native call.
    band, spent, above = _FIRST_BAND, 0.0, 0
    while True:
        _check(deadline, 2 * spent, len(a), len(b), above)
        started = time.perf_counter()
        distance = Levenshtein.distance(a, b, score_cutoff=band)
        spent = time.perf_counter() - started
        if distance <= band:
            break
        above, band = band, band * 2
    _check(deadline, 3 * spent, len(a), len(b), distance)  # the alignment itself: about 3 distance passes
    found = Levenshtein.opcodes(a, b, score_hint=distance)
    ops: list[Opcode] = []
    for tag, i1, i2, j1, j2 in _normalized([(o.tag, o.src_start, o.src_end, o.dest_start, o.dest_end) for o in found]):
        small = (i2 - i1) * (j2 - j1) <= DIRECT_CELLS
        ops += _shift(_refined(a[i1:i2], b[j1:j2]), i1, j1) if tag == "replace" and small else [(tag, i1, i2, j1, j2)]
    return ops


def _refined(a: list[int], b: list[int]) -> list[Opcode]:
    """Opcodes of a small region, keeping as many tokens equal as possible. An edit-distance path may substitute
    a token it could have matched, so regions are re-aligned: by ``difflib`` (what the check always used) when
    small enough for its worst case, else by the longest common subsequence."""
    if len(a) * len(b) <= DIFFLIB_CELLS:
        return SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return [(o.tag, o.src_start, o.src_end, o.dest_start, o.dest_end) for o in Indel.opcodes(a, b)]


def _edits_exceed(a: list[int], b: list[int], bound: int) -> bool:
    if abs(len(a) - len(b)) > bound:  # the length difference alone is more edits
        return True
    return Levenshtein.distance(a, b, score_cutoff=bound) > bound


def _check(deadline: float | None, predicted: float, la: int, lb: int, distance: int) -> None:
    """Raise when a native call predicted to take ``predicted`` seconds would end past ``deadline``."""
    if deadline is None:
        return
    now = time.perf_counter()
    if now + predicted > deadline:
        edits = f", edit distance at least {distance}" if distance else ""
        if now > deadline:
            raise BudgetExceeded(
                f"the time ran out aligning a divergent region of {la} stream and {lb} template tokens"
            )
        raise BudgetExceeded(
            f"aligning a divergent region of {la} stream and {lb} template tokens{edits} would end about "
            f"{now + predicted - deadline:.1f} s past the deadline"
        )


def _shift(ops: list[Opcode], di: int, dj: int) -> list[Opcode]:
    return [(tag, i1 + di, i2 + di, j1 + dj, j2 + dj) for tag, i1, i2, j1, j2 in ops]


def _normalized(ops: list[Opcode]) -> list[Opcode]:
    """Merge adjacent edits into one (``replace`` when both sides have tokens) and adjacent equal runs, as
    ``difflib`` reports them: a divergence is one opcode, however the edit path inside it goes."""
    out: list[Opcode] = []
    for op in ops:
        tag, i1, i2, j1, j2 = op
        if i1 == i2 and j1 == j2:
            continue
        if out and (out[-1][0] == "equal") == (tag == "equal"):
            _, p1, _, q1, _ = out.pop()
            if tag != "equal":
                tag = "replace" if (i2 > p1 and j2 > q1) else ("insert" if i2 == p1 else "delete")
            op = (tag, p1, i2, q1, j2)
        out.append(op)
    return out
