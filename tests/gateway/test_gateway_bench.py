"""bench/gateway.py's goal check: each goal fails when its figures miss it, and --check turns a failure into exit 1
(the benchmark itself runs with ``make bench``, not in the suite)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gateway.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gateway", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the module runs
    spec.loader.exec_module(module)
    return module


def figures(gateway: float = 3.0, late: float = 5.0) -> tuple[dict, dict]:
    """Per-turn figures: ``gateway`` at every concurrency, ``late`` the gateway in turns 193-256."""
    concurrent = {n: {"loop": 1.0, "bare": 2.0, "gateway": gateway} for n in (1, 16, 64)}
    buckets = {
        (9, 32): {"loop": 1.0, "bare": 2.0, "gateway": 3.0, "in_process": 1.0},  # ratio 1.0
        (193, 256): {"loop": 1.0, "bare": 4.0, "gateway": late, "in_process": 2.0},  # ratio late / 5
    }
    return concurrent, buckets


def test_figures_within_the_goals_pass(bench: ModuleType) -> None:
    results = bench.verdicts(*figures())
    assert len(results) == 6 and all(v.ok for v in results)
    assert bench.exit_status(results, check=True) == 0


def test_a_gateway_over_the_ratio_fails(bench: ModuleType) -> None:
    results = bench.verdicts(*figures(gateway=4.6))  # 4.6 / (1 + 2) > 1.5
    assert [v.goal for v in results if not v.ok] == [
        "gateway / (loop + bare), 1 sessions",
        "gateway / (loop + bare), 16 sessions",
        "gateway / (loop + bare), 64 sessions",
    ]
    assert bench.exit_status(results, check=True) == 1
    assert bench.exit_status(results, check=False) == 0


def test_work_growing_faster_than_reading_fails_the_flat_goal(bench: ModuleType) -> None:
    results = bench.verdicts(*figures(late=6.5))  # 6.5 / 5 = 1.3 against 1.0 early: within 1.5, not flat
    assert [v.goal for v in results if not v.ok] == ["flat: that ratio in turns 193-256 / turns 9-32"]
