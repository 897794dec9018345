"""A read-only view of a token stream's first ids: the prompt handed to the engine, without copying the stream.

A trajectory hands back the next prompt after every turn. Copying the whole stream there made each turn cost
O(stream) (about 0.3 ms at 130k tokens); a ``PromptIds`` costs O(1) to create. It is a snapshot: it shows
``ids[:length]`` of a list or packed array that its owner only ever appends to (``TokenTrajectory`` keeps its stream
private and never changes, inserts or removes an id once pushed), so the ids it shows never change. Whoever needs a list
(an engine request, a record) copies once with ``prompt[:]`` or ``list(prompt)``.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any, overload


class PromptIds(Sequence[int]):
    """The first ``length`` ids of an append-only list, read-only: ``len``, indexing, iteration, ``==`` with a list
    or another ``PromptIds`` (as a list compares), and slicing and ``+`` (with a list), which return a new list
    (``prompt[:]``: a copy).

    Every id is a plain ``int`` (the trajectory converts the engine's ids and its template ids come from the
    tokenizer), so a consumer may skip converting them (``EngineCall.of`` does).
    """

    __slots__ = ("_ids", "_length")

    def __init__(self, ids: list[int] | array[int], length: int | None = None) -> None:
        n = len(ids) if length is None else length
        if not 0 <= n <= len(ids):
            raise ValueError(f"a PromptIds view of {n} ids over a list of {len(ids)}")
        self._ids = ids  # the owner's list: appended to only, never changed in place (see the module docstring)
        self._length = n

    def __len__(self) -> int:
        return self._length

    def extends(self, earlier: PromptIds) -> bool:
        """Whether this view shows the same append-only stream as ``earlier``, at least as far: its first
        ``len(earlier)`` ids are then ``earlier``'s (the stream never changes an id once pushed), unread."""
        return self._ids is earlier._ids and self._length >= earlier._length

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        n = self._length
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1:
                part = self._ids[start:stop]
                return part if isinstance(part, list) else part.tolist()
            return [self._ids[i] for i in range(start, stop, step)]
        i = index.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("PromptIds index out of range")
        return self._ids[i]

    def __iter__(self) -> Iterator[int]:
        return islice(self._ids, self._length)

    def __contains__(self, value: object) -> bool:
        return value in islice(self._ids, self._length)  # iterates at C speed

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PromptIds):
            return self._length == other._length and ((self._ids is other._ids) or self[:] == other[:])
        if isinstance(other, list):
            return self._length == len(other) and self[:] == other
        return NotImplemented

    def __add__(self, other: object) -> list[int]:
        """``prompt + ids``: a new list, as with a list (``ids`` a list or another view)."""
        if isinstance(other, PromptIds | list):
            return [*self, *other]
        return NotImplemented

    def __radd__(self, other: object) -> list[int]:
        if isinstance(other, list):
            return [*other, *self]
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a list with the same ids, and a list is unhashable

    def __repr__(self) -> str:
        return f"PromptIds({self[:]!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (a Ray hop) as its own ids only, not the owner's longer list.
        return (PromptIds, (self[:],))
