"""Timing shared by the benchmarks: methods that take turns, each kept at its fastest."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable


def fastest(
    methods: dict[str, Callable[[], object]], runs: int, *, freeze: bool = False
) -> dict[str, tuple[float, float]]:
    """Per method, the fastest (wall s, CPU s: ``time.process_time``, every thread) of ``runs``, the methods taking
    turns within each run (a moment when other processes hold the CPU counts against no method in particular), with
    a garbage collection before each call. ``freeze``: the objects that exist before the timing are frozen out of
    the collector, so that no collection inside a timed call walks them (a benchmark holding large set-up data)."""
    best = {name: (float("inf"), float("inf")) for name in methods}
    gc.collect()
    if freeze:
        gc.freeze()
    try:
        for _ in range(runs):
            for name, fn in methods.items():
                gc.collect()
                wall, cpu = time.perf_counter(), time.process_time()
                fn()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    finally:
        if freeze:
            gc.unfreeze()
    return best
