"""The engine calls indexed by where their outputs start and end in the stream: what a finding asks about the turns
around one position (which turn, does a turn start or end here, does one cover this span), answered by a look-up or
a bisection instead of a scan of every call, so explaining a finding costs the same at turn 1,000 as at turn 10."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from itertools import accumulate

from verl_ext.check.inputs import EngineCall


class CallIndex:
    """Each call's ``(output_start, output_end)``, built once per check. Every answer is the one a scan of the calls
    in order gives (``engine_view.turn_at`` and the template view's former scans), whatever their order: calls out of
    order in the stream (a broken record) are sorted here, not assumed sorted."""

    def __init__(self, calls: Sequence[EngineCall]) -> None:
        self.starts = tuple(c.output_start for c in calls)
        self.ends = tuple(c.output_end for c in calls)
        self._ordered = all(a <= b for a, b in zip(self.starts, self.starts[1:], strict=False))
        self._first_at: dict[int, int] = {}  # output start -> the first call starting there
        self._ending: dict[int, list[int]] = {}  # output end -> the calls ending there, in order
        for k, (s, e) in enumerate(zip(self.starts, self.ends, strict=True)):
            self._first_at.setdefault(s, k)
            self._ending.setdefault(e, []).append(k)
        self._sorted_ends = sorted(self.ends)
        by_start = sorted(range(len(self.starts)), key=lambda k: (self.starts[k], k))
        self._by_start = tuple(by_start)  # call indices by output start
        self._start_keys = tuple(self.starts[k] for k in by_start)
        # the furthest output end among the calls starting at or before each sorted start
        self._reach = tuple(accumulate((self.ends[k] for k in by_start), max))

    def __len__(self) -> int:
        return len(self.starts)

    def turn(self, position: int) -> int:
        """The engine call a stream position belongs to: the last call (by index) whose output starts at or before
        it; 0 when none does (``engine_view.turn_at``)."""
        if self._ordered:
            return max(bisect.bisect_right(self.starts, position) - 1, 0)
        return max((k for k, s in enumerate(self.starts) if s <= position), default=0)

    def first_starting_at(self, position: int) -> int | None:
        """The first call whose output starts at ``position`` (None: none does)."""
        return self._first_at.get(position)

    def starts_at(self, position: int) -> bool:
        """Some call's output starts at ``position``."""
        return position in self._first_at

    def ends_at(self, position: int) -> bool:
        """Some call's output ends at ``position``."""
        return position in self._ending

    def ending_at(self, position: int) -> Sequence[int]:
        """The calls whose output ends at ``position``, in order."""
        return self._ending.get(position, ())

    def end_within(self, lo: int, hi: int) -> bool:
        """Some call's output ends in ``[lo, hi]``."""
        k = bisect.bisect_left(self._sorted_ends, lo)
        return k < len(self._sorted_ends) and self._sorted_ends[k] <= hi

    def covers(self, i1: int, i2: int) -> bool:
        """Some call's output holds ``[i1, i2)`` whole (starts at or before ``i1``, ends at or after ``i2``)."""
        k = bisect.bisect_right(self._start_keys, i1)
        return k > 0 and self._reach[k - 1] >= i2

    def starting_within(self, lo: int, hi: int) -> list[int]:
        """The calls whose output starts in ``[lo, hi]``, in order."""
        a, b = bisect.bisect_left(self._start_keys, lo), bisect.bisect_right(self._start_keys, hi)
        return sorted(self._by_start[a:b])
