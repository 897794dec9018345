"""``LruCache``: the one kind of process-wide cache verl_ext keeps, each with a stated bound.

A training job runs for days in the same worker processes; a module-level dict that gains an entry per new key
(a template, a message shape, a tokenizer object) grows without end. Every process-wide cache is an ``LruCache`` of a
stated ``maxsize``: past it, the least recently used entry goes; or it is per object (a ``weakref.WeakKeyDictionary``
whose entries go with their key). tests/core/test_bounded_caches.py refuses any other module-level dict, list or set
and any ``functools.cache``/``lru_cache(maxsize=None)``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """A thread-safe mapping of at most ``maxsize`` entries; ``name`` says what it caches (for tests and errors)."""

    def __init__(self, name: str, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"cache {name!r}: maxsize must be at least 1, got {maxsize}")
        self.name = name
        self.maxsize = maxsize
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.RLock()

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        """The value of ``key``, made by ``make()`` the first time (not under the lock: ``make`` may be slow or use
        another cache; two threads may both make it, and the first one stored is kept)."""
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        value = make()
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
            self._put(key, value)
            return value

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value of ``key`` (now the most recently used), or ``default``."""
        with self._lock:
            if key not in self._data:
                return default
            self._data.move_to_end(key)
            return self._data[key]

    def __setitem__(self, key: K, value: V) -> None:
        with self._lock:
            self._put(key, value)

    def __getitem__(self, key: K) -> V:
        with self._lock:
            self._data.move_to_end(key)
            return self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[K]:
        with self._lock:
            return iter(list(self._data))

    def values(self) -> list[V]:
        """The values, least recently used first (a copy)."""
        with self._lock:
            return list(self._data.values())

    def pop(self, key: K, default: V | None = None) -> V | None:
        """Remove ``key`` and return its value (``default`` when absent)."""
        with self._lock:
            return self._data.pop(key, default)

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._data.clear()

    def _put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)
